"""Can a built agent learn to copy values it must find by their key? Continue it on copy drills.

    python benchmarks/keyed_value_drills.py --model DIR [--steps 500] [--redraws 3] [--threads 2]
        [--only "said refund"] [--mirror-keys] [--fresh-number-embeddings] [--report-every 50]

Continues training the agent in DIR (in memory; DIR is not written) on the copy drills of the
default build's training demonstrations (`copy_drills` of the seed-0 flawed policy on train seeds
0…3,999, as `build-agent --seed 0` cuts them) whose final turn is not an id read or a
cancellation — the searches, bag and flight updates, certificates and said values (the refund
read by `"amount"` in the reservation), which need a value found by its key in a tool result —
with a fifth of the id-read and cancellation drills kept beside them. With `--redraws K`, every
such drill whose final turn copies a number read earlier comes K more times with that number
re-drawn (as many digits) everywhere in the drill, so that each number token is copied more often
and in more contexts. With `--pool N`, every copied number, in the training and the held-out drills,
is instead re-drawn from N numbers per length (drawn once), so that each is copied often.
(The airline domain asks for no refund or price to be said since 13f4b2e; the
figures of these probes in benchmarks/README.md were measured at d2343e5.) Three probes of why a
number read by its key is not said: `--only KIND` trains and checks one kind
of drill alone; `--mirror-keys` writes each said number with the key it has in the tool result
before it ('The refund is "amount": 582 dollars'), so that with `build-agent --json-keys`'s
tokenizer the token before the number is the same in the record and in the text — the lookup an
induction head does; `--fresh-number-embeddings` re-draws the embeddings of the 2–3-digit number
tokens as distinct random vectors of the mean embedding norm and freezes them.
Every `--report-every` steps: the teacher-forced exactness of the drills of train seeds
4,000…4,199 (after the training ones; the kinds of `agent_id_copying.py`'s
`teacher_forced_drills_exact`, said values split by what they say: refund, price, fee), and for
said values the share of their number tokens predicted. AdamW at `--lr`, batches of 24 drills of
at most 768 tokens.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections import defaultdict

import torch
from tracerl.envs.airline import AirlineEnv

NUMBER = r"(?<![\d-])\d{2,4}(?![\d-])"  # a 2-4 digit number, not part of a date



AIRLINE_KINDS = {t.name: t.kind for t in AirlineEnv().tools}  # the tools' kinds, for drill_kinds

def turn_text(message) -> str:
    return (message.content or "") + "".join(c.function.arguments for c in message.tool_calls or [])


def copied_numbers(drill) -> list[str]:
    """Numbers the drill's final turn says or writes that an earlier message holds."""
    earlier = "\n".join(turn_text(m) for m in drill.messages[:-1])
    return sorted({n for n in re.findall(NUMBER, turn_text(drill.messages[-1]))
                   if re.search(rf"(?<![\d-]){n}(?![\d-])", earlier)})


def redrawn(drill, rng: random.Random, pool: dict[int, list[str]] | None = None):
    """The drill with each copied number replaced, everywhere, by a random one of as many digits
    (from `pool[length]` when given)."""
    swap = {n: rng.choice(pool[len(n)]) if pool else str(rng.randrange(10 ** (len(n) - 1), 10 ** len(n)))
            for n in copied_numbers(drill)}

    def sub(text):
        return re.sub(NUMBER, lambda m: swap.get(m.group(0), m.group(0)), text) if text else text

    messages = []
    for m in drill.messages:
        calls = [c.model_copy(update={"function": c.function.model_copy(update={"arguments": sub(c.function.arguments)})})
                 for c in m.tool_calls or []]
        messages.append(m.model_copy(update={"content": sub(m.content), "tool_calls": calls or m.tool_calls}))
    return drill.model_copy(update={"messages": messages})


def with_keys(drill):
    """The drill with each number its final text copies written as '"KEY": N', KEY the key that
    number has in the latest tool result giving it."""
    last = drill.messages[-1]
    text = last.content
    for n in copied_numbers(drill):
        for m in reversed(drill.messages[:-1]):
            found = re.findall(rf'"(\w+)": {n}(?!\d)', m.content or "") if m.role == "tool" else []
            if found:
                text = re.sub(rf"(?<![\d-]){n}(?![\d-])", f'"{found[-1]}": {n}', text, count=1)
                break
    return drill.model_copy(update={"messages": [*drill.messages[:-1], last.model_copy(update={"content": text})]})


def said_kind(text: str) -> str:
    return ("said refund" if "refund" in text else "said price" if "costs" in text else "said fee" if "You pay" in text
            else "said value")


def drills_by_kind(chat, demos, redraws: int, rng: random.Random, pool: dict[int, list[str]] | None = None,
                   mirror_keys: bool = False) -> dict[str, list]:
    from tracerl.models.build_agent import AgentRecipe, copy_drills, drill_kinds, sft_example

    longest = AgentRecipe().drill_max_tokens
    groups: dict[str, list] = defaultdict(list)
    for trajectory in demos:
        drills = copy_drills(trajectory)
        for kind, d in zip(drill_kinds(drills, AIRLINE_KINDS), drills, strict=True):
            if kind == "said value":
                d = with_keys(d) if mirror_keys else d
                kind = said_kind(d.messages[-1].content)
            numbered = kind != "id read" and bool(copied_numbers(d))
            if pool and numbered:
                d = redrawn(d, rng, pool)
            copies = [redrawn(d, rng, pool) for _ in range(redraws)] if numbered else []
            for example in (sft_example(chat, x) for x in [d, *copies]):
                if len(example[0]) <= longest:
                    groups[kind].append(example)
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--redraws", type=int, default=0)
    ap.add_argument("--pool", type=int, default=0, help="copied numbers re-drawn from this many per length (0: kept)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="train and check this kind of drill alone (e.g. 'said refund')")
    ap.add_argument("--mirror-keys", action="store_true", help="say each copied number after its record key")
    ap.add_argument("--fresh-number-embeddings", action="store_true",
                    help="re-draw the number tokens' embeddings as distinct random vectors and freeze them")
    ap.add_argument("--report-every", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracerl.envs.airline import TRAIN_SEEDS
    from tracerl.models.build_agent import (AgentRecipe, collect_demonstrations, exact_final_turns, final_turn_start,
                                            length_grouped_batches, shared_prefix_loss)
    from tracerl.models.chat import ChatFormat

    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    chat, recipe, start = ChatFormat(tokenizer), AgentRecipe(), time.time()
    pool = {n: [str(v) for v in rng.sample(range(10 ** (n - 1), 10 ** n), min(args.pool, 9 * 10 ** (n - 1)))]
            for n in (2, 3, 4)} if args.pool else None
    train = drills_by_kind(chat, collect_demonstrations(recipe, list(TRAIN_SEEDS[:4000])), args.redraws, rng, pool,
                           args.mirror_keys)
    held_out = drills_by_kind(chat, collect_demonstrations(recipe, list(TRAIN_SEEDS[4000:4200])), 0, rng, pool,
                              args.mirror_keys)
    if args.only:
        train, held_out = ({args.only: d.get(args.only, [])} for d in (train, held_out))
    kept = ("id read", "cancel_reservation")
    pool = [e for kind, examples in train.items() if kind not in kept for e in examples]
    pool += [e for kind in kept for e in train.get(kind, []) if rng.random() < 0.2]
    print(f"drills: {len(pool)} of {sum(map(len, train.values()))}; held out: "
          + ", ".join(f"{k} {len(v)}" for k, v in sorted(held_out.items())), flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)

    number_ids = {i for t, i in tokenizer.get_vocab().items() if t.isdigit() and len(t) >= 2}

    @torch.no_grad()
    def numbers_predicted(examples) -> float:
        """Share of the number tokens of the examples' final turns that are the argmax, teacher-forced."""
        model.eval()
        right = total = 0
        for ids, mask in examples:
            logits = model(torch.tensor([ids])).logits[0]
            for p in range(max(1, final_turn_start(mask)), len(ids)):
                if ids[p] in number_ids:
                    total += 1
                    right += int(logits[p - 1].argmax()) == ids[p]
        return right / max(1, total)

    if args.fresh_number_embeddings:
        weight = model.get_input_embeddings().weight
        numbers = torch.tensor(sorted(number_ids))
        fresh = torch.randn(len(numbers), weight.shape[1], generator=torch.Generator().manual_seed(args.seed))
        with torch.no_grad():
            weight[numbers] = fresh / fresh.norm(dim=1, keepdim=True) * weight.norm(dim=1).mean()
        trained = torch.ones(weight.shape[0], 1)
        trained[numbers] = 0
        weight.register_hook(lambda grad: grad * trained)

    def report(step: int) -> None:
        rates = {k: exact_final_turns(model, v, tokenizer.pad_token_id) for k, v in sorted(held_out.items())}
        rates.update({f"{k} numbers": numbers_predicted(v) for k, v in sorted(held_out.items()) if k.startswith("said")})
        model.train()
        print(f"step {step} ({time.time() - start:.0f} s): " + ", ".join(f"{k} {r:.2f}" for k, r in rates.items()), flush=True)

    report(0)
    order: list[list[int]] = []
    for step in range(1, args.steps + 1):
        if not order:
            order = length_grouped_batches([len(ids) for ids, _ in pool], 24, rng)
        loss, _ = shared_prefix_loss(model, [pool[i] for i in order.pop()], 0, tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.report_every == 0:
            report(step)


if __name__ == "__main__":
    main()
