"""Live τ²-bench episodes per second: the tiny agent as tracerl's policy, the tiny agent again as
τ²-bench's user simulator behind `tracerl serve` on loopback.

    python benchmarks/tau2_live.py [--tau2-python .venv-tau2/bin/python] [--tasks 8] [--out results/tau2_live.json]

For mock (its first tasks) and retail (the first tasks of its test split, DB basis), the same
episodes played one at a time and all at once (`batch_size` = tasks), greedy, 32 new tokens per
agent turn and 24 per user turn, τ²-bench's max_steps 12: wall seconds, episodes/s, the share of
episodes the user simulator broke (`infrastructure_error`), and the machine's load average.
τ²-bench's data comes from tests/data/tau2 (linked into a temporary data folder).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "tau2"


def data_folder() -> str:
    root = Path(tempfile.mkdtemp(prefix="tau2-data-"))
    (root / "tau2" / "domains").mkdir(parents=True)
    for name in ("mock", "retail"):
        (root / "tau2" / "domains" / name).symlink_to(DATA / "domains" / name, target_is_directory=True)
    (root / "tau2" / "user_simulator").symlink_to(DATA / "user_simulator", target_is_directory=True)
    return str(root)


def measure(domain: str, split: str, tasks: int, batch_size: int, settings: dict) -> dict:
    from tracerl.envs.registry import make_env
    from tracerl.models.factory import make_policy
    from tracerl.evaluation.evaluate import play

    def make():
        return make_env(f"tau2:{domain}", split=split, **settings)

    policy = make_policy("model", max_new_tokens=32)
    seeds = make().task_seeds(tasks)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    trajectories = play(make, policy, seeds, batch_size=batch_size)
    seconds = time.perf_counter() - start
    broken = sum(t.termination == "infrastructure_error" for t in trajectories)
    return {"domain": domain, "split": split, "episodes": len(trajectories), "batch_size": batch_size,
            "seconds": round(seconds, 1), "episodes_per_s": round(len(trajectories) / seconds, 3),
            "user_simulator_broke": broken, "agent_turns": sum(sum(m.role == "assistant" for m in t.messages) for t in trajectories),
            "load_before": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tau2-python", default=str(ROOT / ".venv-tau2" / "bin" / "python"))
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tau2_live.json")
    args = parser.parse_args()

    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    rows = []
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=args.tasks) as user:
        settings = {"python": args.tau2_python, "data_dir": data_folder(), "reward_basis": ["DB"], "max_steps": 12,
                    "user": {"model": "tiny-agent", "base_url": user.base_url, "max_tokens": 24}}
        for domain, split in (("mock", "base"), ("retail", "test")):
            for batch_size in (1, args.tasks):
                rows.append(measure(domain, split, args.tasks, batch_size, settings))
                print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "cpus": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
