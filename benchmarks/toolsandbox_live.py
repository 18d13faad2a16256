"""ToolSandBox live: how its own evaluation grades two agents on its offline scenarios, and how fast.

    python benchmarks/toolsandbox_live.py [--python .venv-toolsandbox/bin/python] [--split base] [--tasks N]
                                          [--out benchmarks/results/toolsandbox_live.json]

The user simulator is the tiny agent behind `tracerl serve`'s server on loopback (24 new tokens per
user turn, `tool_choice: none`: the tiny agent's tool calls are airline ones, which ToolSandBox's
user role rejects, so it speaks only and the episodes end at the scenario's 30-message limit). Two agents play the split's scenarios (default: all 91 offline base scenarios), every
episode graded by ToolSandBox's milestone/minefield evaluation:

- `milestone-replay` (`tracerl.envs.toolsandbox.MilestoneReplay`): what each scenario's milestones
  name of the agent — its tool calls, its words — in order. Perfect wherever the milestones name
  every change and the simulated user lets it finish: a check of the integration (calls, words and
  grading line up);
- the shipped tiny agent, greedy (32 new tokens per turn): built on the airline domain, it names
  airline tools, which ToolSandBox's runner scores 0.

Per agent: perfect scenarios (similarity 1), mean similarity, terminations, wall seconds and the
load average before it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(name: str, make, policy, seeds: list[int], batch_size: int) -> dict:
    from tracerl.envs.runner import Episode, rollout

    load = os.getloadavg()[0]
    start = time.perf_counter()
    trajectories = rollout(make, policy, [Episode(seed=s) for s in seeds], batch_size=batch_size)
    seconds = time.perf_counter() - start
    rewards = [t.reward for t in trajectories]
    return {"agent": name, "scenarios": len(trajectories), "perfect": sum(t.passed for t in trajectories),
            "mean_similarity": round(sum(rewards) / len(rewards), 4),
            "terminations": dict(Counter(t.termination for t in trajectories)),
            "perfect_scenarios": sorted(t.task_id for t in trajectories if t.passed),
            "seconds": round(seconds, 1), "load_before": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv-toolsandbox" / "bin" / "python"))
    parser.add_argument("--split", default="base")
    parser.add_argument("--tasks", type=int, default=None, help="the first N scenarios of the split (default: all)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "toolsandbox_live.json")
    args = parser.parse_args()

    from tracerl.envs.registry import make_env
    from tracerl.models.factory import make_policy
    from tracerl.envs.toolsandbox import MilestoneReplay
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=4) as server:
        user = {"model": "tiny-agent", "base_url": server.base_url, "max_tokens": 24, "tool_choice": "none"}

        def make():
            return make_env("toolsandbox", split=args.split, python=args.python, user=user)

        env = make()
        seeds = env.task_seeds(args.tasks or len(env.task_ids))
        results = {"split": args.split, "left_out": env.left_out, "agents": [
            measure("milestone-replay", make, MilestoneReplay(), seeds, args.batch_size),
            measure("tiny-agent", make, make_policy("model", max_new_tokens=32), seeds, args.batch_size)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for row in results["agents"]:
        print(json.dumps({k: v for k, v in row.items() if k != "perfect_scenarios"}))
    print(f"left out: {len(results['left_out'])} scenarios (RapidAPI); written to {args.out}")


if __name__ == "__main__":
    main()
