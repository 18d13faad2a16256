"""What a wider embedded agent costs: one SFT/GRPO-sized training step and one batch of greedy
sampling, per model width and number type, side by side in one process.

    python benchmarks/agent_size.py [--widths 128 256 512] [--repeats 3] [--threads 2]

For each hidden size (4 layers, head_dim 32, 2 query heads per key/value head, vocabulary 2,048,
the shipped agent's shape at 128) and each number type:

- train step: forward + backward + AdamW on 8 sequences of 1,024 tokens (float32; bfloat16 under
  `torch.autocast`, float32 master weights);
- sampling: 8 sequences greedily continued by 64 tokens after a 700-token prompt (the airline
  opening is ~650), KV cache on (float32; bfloat16 weights).

Median seconds of `--repeats` timed runs after one warm-up, and the ratio to hidden 128 in
float32 measured in the same run. The load average is printed before and after: on a shared
machine the absolute figures move, the ratios much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tracerl.models.tiny import count_parameters, tiny_qwen3, tiny_qwen3_config

VOCAB, LAYERS, HEAD_DIM = 2048, 4, 32


def build(hidden: int, dtype: torch.dtype) -> torch.nn.Module:
    heads = hidden // HEAD_DIM
    config = tiny_qwen3_config(VOCAB, hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=heads,
                               num_key_value_heads=max(1, heads // 2), max_position_embeddings=2048)
    return tiny_qwen3(config, seed=0).to(dtype)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step(hidden: int, bf16: bool, repeats: int) -> float:
    model = build(hidden, torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(1, VOCAB, (8, 1024), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, repeats)


@torch.no_grad()
def sampling(hidden: int, bf16: bool, repeats: int) -> float:
    model = build(hidden, torch.bfloat16 if bf16 else torch.float32)
    prompt = torch.randint(1, VOCAB, (8, 700), generator=torch.Generator().manual_seed(1))

    def generate() -> None:
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64,
                       min_new_tokens=64, do_sample=False, pad_token_id=0)

    return timed(generate, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if any(w % HEAD_DIM for w in args.widths):
        parser.error(f"--widths must be multiples of {HEAD_DIM}")
    torch.set_num_threads(args.threads)
    print(f"load average at start: {os.getloadavg()}; torch {torch.__version__}, {args.threads} threads")
    rows = []
    for hidden in args.widths:
        params = count_parameters(build(hidden, torch.float32))
        for bf16 in (False, True):
            rows.append((hidden, params, "bf16" if bf16 else "fp32",
                         train_step(hidden, bf16, args.repeats), sampling(hidden, bf16, args.repeats)))
            print(f"  hidden {hidden} {rows[-1][2]}: train {rows[-1][3]:.3f} s, sampling {rows[-1][4]:.3f} s", flush=True)
    base = next((r for r in rows if r[0] == 128 and r[2] == "fp32"), rows[0])
    print("\n| hidden | parameters | type | train step (s) | × | sampling 8×64 (s) | × |\n|---:|---:|---|---:|---:|---:|---:|")
    for hidden, params, kind, train, sample in rows:
        print(f"| {hidden} | {params:,} | {kind} | {train:.3f} | {train / base[3]:.2f} | {sample:.3f} | {sample / base[4]:.2f} |")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
