"""The continuous engine's key-value memory: every slot the longest episode's length against a token budget.

    python benchmarks/sampling_memory.py [--episodes 32] [--batch 16] [--budgets 16384 8192 4096] [--out FILE]

The shipped tiny agent plays `--episodes` airline test episodes (temperature 1, 256 new tokens per turn, at most
12 turns) through the continuous engine with `--batch` in flight: once without a budget (`SlotCache`: `--batch`
slots × the longest episode's capacity) and once per budget (`PagedCache`, `rollout.kv_cache_tokens`). For each:
the key-value positions allocated at the peak (× 8 KiB per position for this model: 4 layers × 2 × 2 heads × 32
× 4 bytes; Qwen3-8B in bfloat16 holds 144 KiB), the blocks in use at the peak, how often a turn waited and an idle
episode's cache was dropped, wall seconds, and whether every episode's tokens equal the unbounded run's. Prints
JSON (and --out) with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def load_average() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--budgets", type=int, nargs="+", default=[16384, 8192, 4096])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from tracerl.envs.airline.env import AirlineEnv
    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.local import LocalPolicy, load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("tiny-agent", device="cpu")
    config = model.config
    bytes_per_position = (config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim
                          * next(model.parameters()).element_size())
    episodes = [Episode(seed=1_000_003 + k) for k in range(args.episodes)]

    def run(budget):
        policy = LocalPolicy(model, tokenizer, temperature=1.0, max_new_tokens=256, seed=11, kv_cache_tokens=budget)
        made = []
        make = policy.turns
        policy.turns = lambda rows: made.append(make(rows)) or made[-1]
        start = time.perf_counter()
        trajectories = rollout(lambda: AirlineEnv(split="test", max_turns=12), policy, episodes, batch_size=args.batch)
        seconds = time.perf_counter() - start
        (sampler,) = made[0].samplers.values()
        cache = sampler.cache
        row = {"kv_cache_tokens": budget, "seconds": round(seconds, 1),
               "peak_allocated_positions": sampler.peak_allocated_tokens,
               "peak_allocated_mib": round(sampler.peak_allocated_tokens * bytes_per_position / 2**20, 2),
               "forwards": sampler.forwards}
        if budget is not None:
            row.update(peak_used_positions=cache.peak_blocks * cache.block, turns_held_back=sampler.held_back,
                       caches_dropped=sampler.dropped)
        return trajectories, row

    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_average_before": load_average(),
              "episodes": args.episodes, "batch": args.batch, "bytes_per_position": bytes_per_position, "runs": []}
    reference, row = run(None)
    row["longest_episode_tokens"] = max(len(t.tokens.ids) for t in reference)
    result["runs"].append(row)
    for budget in args.budgets:
        trajectories, row = run(budget)
        row["same_tokens"] = sum(a.tokens.ids == b.tokens.ids for a, b in zip(trajectories, reference))
        result["runs"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    result["load_average_after"] = load_average()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
