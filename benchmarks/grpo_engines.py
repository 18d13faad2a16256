"""The demo's GRPO stage with each in-process sampling engine, side by side in one run.

The demo's training settings (`src/tracerl/configs/demo.yaml`: 4 groups × 8 rollouts per step,
256 new tokens per turn at temperature 1, LoRA r 8, micro-batches of 8) on two of its template
environments (airline target, difficulty 1), trained twice from the same seed: rollouts through
`LocalPolicy(engine="lockstep")` (rounds of `act`: every live episode's turn in one batch, rows
waiting for the longest) and `engine="continuous"` (the default: `tracerl.models.continuous`).
Held-out evaluation is off (`eval_episodes: 0`) so the steps are timed alone. Per step: wall and
CPU seconds of the sampling and of the whole step; and whether both engines gave the same rewards
(their episodes are seeded alike; they differ only where float32 kernels of other batch shapes
flip a token).

    python benchmarks/grpo_engines.py [--steps 6] [--env multi_step_completion] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

TEMPLATES = ("multi_step_completion", "structured_data_reasoning")


def train_with(engine: str, env_dir: Path, steps: int, out: Path) -> list[dict]:
    from tracerl.config import DEMO_CONFIG, load_run_config, train_config
    from tracerl.training.run import build_trainer, resolve_env

    run = load_run_config(DEMO_CONFIG)
    cfg = train_config(run.train, run.rollout, run.seed).model_copy(update={"max_steps": steps, "eval_episodes": 0,
                                                                  "save_steps": steps})
    make_env, name, _ = resolve_env(env_dir)
    cpu = [0.0]
    trainer = build_trainer(cfg, run.model.base, make_env, out, env_source=name,
                            on_step=lambda row: cpu.append(time.process_time()))
    make_policy = trainer.backend.make_policy

    def with_engine(greedy: bool, seed: int):
        policy = make_policy(greedy, seed)
        policy.engine = engine
        return policy

    trainer.backend.make_policy = with_engine
    cpu[0] = time.process_time()
    rows = [r for r in trainer.train() if r["step"] > 0]
    for row, a, b in zip(rows, cpu, cpu[1:]):
        row["cpu_seconds"] = round(b - a, 3)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps per engine (the demo runs 12)")
    ap.add_argument("--env", choices=TEMPLATES, action="append", help="default: both")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tracerl.contracts import EnvSpec
    from tracerl.envs.synthetic.envdir import write_env_dir
    from tracerl.synthesis.target import load_target

    report: dict = {"steps": args.steps, "threads": 1, "torch": torch.__version__, "environments": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for template in args.env or TEMPLATES:
            env_dir = write_env_dir(Path(tmp) / "envs" / template,
                                    EnvSpec(capability=template, template=template, target="airline", difficulty=1),
                                    load_target("airline"))
            result = {}
            for engine in ("lockstep", "continuous"):
                load = os.getloadavg()[0]
                rows = train_with(engine, env_dir, args.steps, Path(tmp) / f"{template}-{engine}")
                result[engine] = {
                    "rollout_s": [r["rollout_seconds"] for r in rows], "step_s": [r["seconds"] for r in rows],
                    "step_cpu_s": [r["cpu_seconds"] for r in rows],
                    "total_s": round(sum(r["seconds"] for r in rows), 2),
                    "total_rollout_s": round(sum(r["rollout_seconds"] for r in rows), 2),
                    "total_cpu_s": round(sum(r["cpu_seconds"] for r in rows), 2),
                    "median_step_s": round(statistics.median(r["seconds"] for r in rows), 3),
                    "reward_mean": [round(r["reward_mean"], 4) for r in rows],
                    "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
                }
                print(template, engine, json.dumps(result[engine]), flush=True)
            result["same_rewards"] = result["lockstep"]["reward_mean"] == result["continuous"]["reward_mean"]
            result["continuous_speedup_wall"] = round(result["lockstep"]["total_s"] / result["continuous"]["total_s"], 2)
            result["continuous_speedup_cpu"] = round(result["lockstep"]["total_cpu_s"] / result["continuous"]["total_cpu_s"], 2)
            result["continuous_rollout_speedup_wall"] = round(
                result["lockstep"]["total_rollout_s"] / result["continuous"]["total_rollout_s"], 2)
            report["environments"][template] = result
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
