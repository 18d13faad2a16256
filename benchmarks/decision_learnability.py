"""Learnability: can the embedded agent, with one LoRA adapter, learn the target's cancel decision
when it is told the answer?

GRPO has to find the decision by sampling it; this benchmark takes sampling out of the question.
It plays the precondition template's target half (the airline's own cancellation requests on their
records, under its rules) up to the reservation read — the request, the user id, the user's and the
reservation's records — and trains a LoRA adapter (the demo's: r 8, α 16, every projection) with
cross-entropy on the reply's first token alone: "Sorry" (refuse) where the rules forbid the
cancellation, "I" ("I will cancel …") where they allow it. Training records come from train-split
task seeds, held-out ones from test-split seeds. Every --eval-every steps it reports the held-out
accuracy (the likelier of the two tokens) and the mean probability of refusing.

    python benchmarks/decision_learnability.py --out DIR/decision.json [--steps 300] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch


def decision_contexts(target, pool: dict, n: int, tokenizer, first_seed: int = 0) -> list[tuple[list[int], bool]]:
    """(prompt ids up to the reply after the reservation read, allowed) of the first `n` target-half tasks
    of the precondition template whose requests come from `pool` (request examples)."""
    from tracerl.core.messages import Message, ToolCall
    from tracerl.models.chat import ChatFormat
    from tracerl.envs.synthetic.templates.precondition import PreconditionVerificationEnv

    chat = ChatFormat(tokenizer)
    env = PreconditionVerificationEnv(dataclasses.replace(target, request_examples=pool), difficulty=0)
    out, seed = [], first_seed
    while len(out) < n:
        messages = list(env.reset(seed=seed)[0])
        seed += 1
        task = env._task
        if not task.kind.startswith("target-"):
            continue
        record_id = next(iter(task.records))
        for turn in (Message.assistant("Hello! Please tell me your user id."),
                     Message.assistant(tool_calls=[ToolCall.make("get_user_details", {"user_id": task.user_id}, "call_0")]),
                     Message.assistant(tool_calls=[ToolCall.make(env.family.check.name, {env.id_param: record_id}, "call_1")])):
            messages += [turn, *env.step(turn)[0]]
        out.append((chat.prompt_ids(messages, env.tools), task.kind == "target-allowed"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", default="tiny-agent")
    ap.add_argument("--train-contexts", type=int, default=1200)
    ap.add_argument("--test-contexts", type=int, default=300)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from peft import LoraConfig, get_peft_model

    from tracerl.envs.airline.tasks import task_seeds
    from tracerl.envs.registry import make_env
    from tracerl.models.local import load_model
    from tracerl.synthesis.target import load_target, task_request_examples

    t0 = time.perf_counter()
    model, tokenizer = load_model(args.base)
    refuse, proceed = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in ("Sorry", "I"))
    target, domain = load_target("airline"), make_env("airline")
    pools = {"train": task_request_examples(domain, task_seeds("train", 4000), per_tool=10**6),
             "test": task_request_examples(domain, task_seeds("test", 1000), per_tool=10**6)}
    train = decision_contexts(target, pools["train"], args.train_contexts, tokenizer)
    test = decision_contexts(target, pools["test"], args.test_contexts, tokenizer)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))

    def next_logits(ids: list[int]) -> torch.Tensor:
        return model(input_ids=torch.tensor([ids])).logits[0, -1, [refuse, proceed]]

    def evaluate(data: list[tuple[list[int], bool]]) -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            probs = [next_logits(ids).softmax(-1) for ids, _ in data]
        return {"accuracy": sum((p[1] > p[0]).item() == ok for p, (_, ok) in zip(probs, data)) / len(data),
                "p_refuse_forbidden": sum(p[0].item() for p, (_, ok) in zip(probs, data) if not ok) / sum(not ok for _, ok in data),
                "p_refuse_allowed": sum(p[0].item() for p, (_, ok) in zip(probs, data) if ok) / sum(ok for _, ok in data)}

    rows = [{"step": 0, "test": evaluate(test)}]
    print(json.dumps(rows[-1]), flush=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    rng = random.Random(args.seed)
    for step in range(1, args.steps + 1):
        model.train()
        batch = rng.sample(train, args.batch_size)
        loss = sum(torch.nn.functional.cross_entropy(next_logits(ids)[None], torch.tensor([1 if ok else 0]))
                   for ids, ok in batch) / len(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            rows.append({"step": step, "loss": round(loss.item(), 4), "test": evaluate(test)})
            print(json.dumps(rows[-1]), flush=True)
    result = {"base": args.base, "train_contexts": len(train), "test_contexts": len(test),
              "test_forbidden": sum(not ok for _, ok in test),
              "pool_records": {k: sum(len(v) for v in p.values()) for k, p in pools.items()},
              "steps": args.steps, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
