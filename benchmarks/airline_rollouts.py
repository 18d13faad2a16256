"""Speed and size of the built-in airline domain: scripted rollouts per second, episode length in tokens.

    python benchmarks/airline_rollouts.py [--tasks 1000]

Token counts use two simple splits that bracket a tiny tokenizer: words (runs of letters/digits,
each punctuation mark alone) and words with every digit alone (as a small BPE tends to do).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

from tracerl.envs.airline import task_seeds
from tracerl.envs.registry import make_env
from tracerl.models.factory import make_policy
from tracerl.envs.runner import Episode, rollout

WORDS = re.compile(r"\w+|[^\w\s]")
DIGITS = re.compile(r"[A-Za-z_]+|\d|[^\w\s]")


def episode_text(trajectory) -> str:
    parts = []
    for m in trajectory.messages:
        parts.append(m.content or "")
        parts += [f"{c.function.name} {c.function.arguments}" for c in (m.tool_calls or [])]
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args()
    seeds = task_seeds("test", args.tasks)
    oracle = []
    for spec in ("oracle", "flawed:0.25,0.25,0.25,0.25"):
        start = time.perf_counter()
        trajectories = rollout(lambda: make_env("airline", split="test"), make_policy(spec, make_env=lambda: make_env("airline")), [Episode(seed=s) for s in seeds])
        seconds = time.perf_counter() - start
        passed = sum(t.passed for t in trajectories)
        oracle = oracle or trajectories
        print(f"{spec}: {len(seeds)} episodes in {seconds:.2f} s ({len(seeds) / seconds:.0f}/s), pass {passed / len(seeds):.1%}")
    for name, pattern in (("words", WORDS), ("digits split", DIGITS)):
        counts = sorted(len(pattern.findall(episode_text(t))) for t in oracle)
        q = statistics.quantiles(counts, n=100)
        print(f"oracle episode tokens ({name}, system prompt included): median {q[49]:.0f}, p90 {q[89]:.0f}, "
              f"p99 {q[98]:.0f}, max {counts[-1]}")
    tools = json.dumps([t.to_openai() for t in trajectories[0].tools])
    print(f"tool schemas as JSON: {len(WORDS.findall(tools))} word tokens")


if __name__ == "__main__":
    main()
