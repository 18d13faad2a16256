"""Calibrate every built-in capability template with a base policy (default: the shipped tiny agent).

    OMP_NUM_THREADS=1 python benchmarks/calibrate_templates.py --target airline --seeds 100 --group-size 16

For each template: write an env directory (difficulty `--difficulty`) into a temporary folder, run
`calibrate_env_dir` (temperature 0.7, up to 5 difficulty rounds) and print one line per round plus
a summary table; `--out FILE` also writes every CalibrationResult as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from tracerl.contracts import EnvSpec
from tracerl.commands.synthesize import make_policy
from tracerl.envs.synthetic.envdir import write_env_dir
from tracerl.synthesis.synthesize import calibrate_env_dir
from tracerl.synthesis.target import load_target
from tracerl.envs.synthetic.templates import TEMPLATES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="airline")
    parser.add_argument("--model", default="tiny-agent")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--max-rounds", type=int, default=5)
    parser.add_argument("--templates", default=",".join(TEMPLATES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = load_target(args.target)
    policy = make_policy(args.model, args.temperature, seed=0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.templates.split(","):
            spec = EnvSpec(capability=name, template=name, target=target.name, difficulty=args.difficulty)
            env_dir = write_env_dir(Path(tmp) / name, spec, target)
            start = time.perf_counter()
            result = calibrate_env_dir(env_dir, policy, seeds=args.seeds, group_size=args.group_size,
                                       max_rounds=args.max_rounds, settings={"temperature": args.temperature})
            seconds = time.perf_counter() - start
            results[name] = {**result.model_dump(mode="json"), "seconds": seconds}
            for r in result.rounds:
                s = r.stats
                pk = " ".join(f"p@{k}={v:.2f}" for k, v in s.pass_at_k.items())
                print(f"{name} d={r.difficulty}: mean={s.mean_reward:.3f} succ={s.success_rate:.3f} "
                      f"std={s.reward_std:.3f} all1={s.all_success:.2f} all0={s.all_zero:.2f} "
                      f"const={s.constant:.2f} inf={s.informative:.2f} {pk} {'OK' if r.accepted else '; '.join(r.reasons)}",
                      flush=True)
            print(f"{name}: {'accepted' if result.accepted else 'NOT accepted'} at difficulty {result.difficulty} "
                  f"({result.stop_reason}); {seconds:.0f} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
