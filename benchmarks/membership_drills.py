"""Does a built agent learn to cite the user's membership in a compensation check once that check is drilled?

    python benchmarks/membership_drills.py [--model tiny-agent] [--train-seeds 3000] [--steps 150] [--report-every 50]
        [--threads 1] [--seed 0]

A compensation check ("Check: a flight cancelled (cancelled) yes, silver or gold (gold) yes, …") cites
words only, so `build-agent`'s copy drills never end at one; `copy_drills(…, said_words=True)`
(`build-agent --drill-said-words`) drills it from the user's answer with the id, whose user record
holds the membership. This continues the agent in --model (in memory) on those drills of the
teacher's demonstrations (the shipped agent's recipe, from its build.json: `--rule-check --cite-values
--hinted-share 0.25`, seed 1) on
train seeds 0…N−1, 12 a step beside 12 of its ordinary copy drills (AdamW 1e-3, gradient norm 1),
and every --report-every steps counts, per true membership, the held-out checks (train seeds
4,000…4,799) whose membership after "silver or gold (" the agent predicts exactly (every token the
argmax given the ones before it: what greedy decoding writes).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import torch

CITED = "silver or gold ("


def compensation_check_drills(demos) -> list[tuple]:
    """(drill, membership) for every drill whose final turn is a compensation check."""
    from tracerl.models.build_agent import copy_drills

    return [(d, re.search(r"silver or gold \(([^)]*)\)", d.messages[-1].content).group(1))
            for t in demos for d in copy_drills(t, said_words=True)
            if not d.messages[-1].tool_calls and CITED in (d.messages[-1].content or "")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-agent")
    ap.add_argument("--train-seeds", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--report-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    from tracerl.envs.airline import TRAIN_SEEDS
    from tracerl.models.build_agent import (AgentRecipe, collect_demonstrations, copy_drills, exact_final_turns,
                                            final_turn_start, sft_example, shared_prefix_loss)
    from tracerl.models import tiny_agent
    from tracerl.models.chat import ChatFormat
    from tracerl.models.local import load_model

    model, tokenizer = load_model(args.model, device="cpu")
    chat, start = ChatFormat(tokenizer), time.time()
    recipe = AgentRecipe(**json.loads((Path(tiny_agent.__file__).parent / "build.json").read_text())["recipe"])
    demos = collect_demonstrations(recipe, list(TRAIN_SEEDS[:args.train_seeds]))
    checks = [sft_example(chat, d) for d, _ in compensation_check_drills(demos)]
    held_out = [(sft_example(chat, d), m) for d, m in
                compensation_check_drills(collect_demonstrations(recipe, list(TRAIN_SEEDS[4000:4800])))]
    others = [e for e in (sft_example(chat, d) for t in demos for d in copy_drills(t)) if len(e[0]) <= recipe.drill_max_tokens]
    print(f"{time.time() - start:.0f} s: {len(checks)} compensation-check drills, {len(others)} other drills; held out "
          f"{len(held_out)} ({dict(Counter(m for _, m in held_out))})", flush=True)
    opener = tokenizer(CITED, add_special_tokens=False)["input_ids"]
    by_membership: dict[str, list[tuple[list[int], list[int]]]] = {}
    for (ids, mask), membership in held_out:  # each check cut after its membership, whose tokens alone are judged
        at = next(i for i in range(final_turn_start(mask), len(ids)) if ids[i:i + len(opener)] == opener) + len(opener)
        span = len(tokenizer(membership, add_special_tokens=False)["input_ids"])
        by_membership.setdefault(membership, []).append((ids[:at + span], [0] * at + [1] * span))

    def cited() -> dict[str, str]:
        return {m: f"{round(exact_final_turns(model, examples, tokenizer.pad_token_id) * len(examples))}/{len(examples)}"
                for m, examples in sorted(by_membership.items())}

    print(f"step 0: cited right {cited()}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    for step in range(1, args.steps + 1):
        batch = rng.sample(checks, min(12, len(checks))) + rng.sample(others, 12)
        loss, _ = shared_prefix_loss(model, batch, 0, tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % args.report_every == 0:
            print(f"step {step} ({time.time() - start:.0f} s, loss {loss.item():.3f}): cited right {cited()}", flush=True)


if __name__ == "__main__":
    main()
