"""Speed: a composed model's held-out evaluation, sampled in lockstep batches against the continuous batch.

    python benchmarks/composed_engines.py --composed WS/composed [--tasks 200] [--batch 64] [--threads 2]

Plays the same greedy test-split airline episodes through `ComposedPolicy` with `engine="lockstep"`
and with `engine="continuous"` (the default since the continuous engine samples composed models:
each episode routed once, its routing weights one row of the running batch), side by side in one
process, and reports wall and CPU seconds, the speed-up, and how many episodes gave the same token ids
and the same routing under both. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from tracerl.envs.airline.tasks import task_seeds


def load_average() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--composed", required=True, help="a composed model's directory (a workspace's composed/)")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="episodes in flight (the evaluation stage's batch, rollout.batch_size)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from tracerl.models.composed.artifact import load_composed
    from tracerl.models.composed.policy import ComposedPolicy
    from tracerl.envs.registry import make_env
    from tracerl.envs.runner import Episode, rollout

    model = load_composed(args.composed)
    episodes = [Episode(seed=s) for s in task_seeds("test", args.tasks)]
    out: dict = {"composed": args.composed, "tasks": args.tasks, "batch": args.batch, "threads": args.threads}
    played = {}
    for engine in ("lockstep", "continuous"):
        policy = ComposedPolicy(model, temperature=0.0, seed=0, engine=engine, max_new_tokens=256, max_batch_size=args.batch)
        wall, cpu = time.perf_counter(), time.process_time()
        played[engine] = rollout(lambda: make_env("airline", split="test"), policy, episodes, batch_size=args.batch)
        out[engine] = {"wall_seconds": round(time.perf_counter() - wall, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
                       "passed": sum(t.reward == 1.0 for t in played[engine]), "load_average": load_average()}
    pairs = list(zip(played["lockstep"], played["continuous"], strict=True))
    out["same_tokens"] = sum(a.tokens.ids == b.tokens.ids for a, b in pairs)
    out["same_routing"] = sum(a.info.get("routing") == b.info.get("routing") for a, b in pairs)
    out["speedup_wall"] = round(out["lockstep"]["wall_seconds"] / out["continuous"]["wall_seconds"], 2)
    out["speedup_cpu"] = round(out["lockstep"]["cpu_seconds"] / out["continuous"]["cpu_seconds"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
