"""The code domain's costs: a sandboxed pytest run, an oracle episode, selection on flawed rollouts.

    python benchmarks/code_domain.py [--episodes 40] [--runs 10] [--json out.json]

Measures, on this machine (its load average printed with the figures):
- one grading-sized pytest run in the sandbox, in the fork server's pre-loaded interpreter
  (`run_pytest`, what the grader and `python -m pytest` commands use) against a launched
  `python -m pytest` in the same sandbox (`run_in_copy`), median of `--runs`, caches bypassed;
- the oracle's episodes (search, view, edit, test, submit, graded), seconds each, on fresh tasks;
- the flawed policy (0.4 each fault) on `--episodes` train tasks: pass rate, planted faults, and
  what rules selection selects from them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tracerl.envs.code.sandbox import run_in_copy, run_pytest
from tracerl.envs.code.tasks import generate_task
from tracerl.envs.registry import make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.selection.stage import SelectConfig, run_select


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out: dict = {"load_average": os.getloadavg()}
    task = generate_task(7)
    files = {**task.fixed_files(), **task.hidden_tests}
    pytest_args = ["-q", "-rA", "-p", "no:cacheprovider", "tests"]
    run_pytest(files, pytest_args)  # the server starts
    out["pytest_forked_s"] = round(timed(lambda: run_pytest(files, pytest_args), args.runs), 3)
    out["pytest_launched_s"] = round(timed(lambda: run_in_copy(files, ["python", "-m", "pytest", *pytest_args]), args.runs), 3)
    seeds = list(range(500_000 // 5, 500_000 // 5 + args.episodes))  # tasks no cache has seen
    start = time.perf_counter()
    oracle = rollout(lambda: make_env("code"), make_env("code").reference_policy("oracle"), [Episode(seed=s) for s in seeds])
    out["oracle_episode_s"] = round((time.perf_counter() - start) / len(oracle), 3)
    out["oracle_pass_rate"] = sum(t.passed for t in oracle) / len(oracle)
    start = time.perf_counter()
    flawed = rollout(lambda: make_env("code", split="train"), make_env("code").reference_policy("flawed:0.4,0.4,0.4,0.4"),
                     [Episode(seed=s) for s in range(args.episodes)])
    out["flawed_episode_s"] = round((time.perf_counter() - start) / len(flawed), 3)
    out["flawed_pass_rate"] = sum(t.passed for t in flawed) / len(flawed)
    out["planted"] = dict(collections.Counter(f for t in flawed for f in t.info["faults"]["planted"]))
    with tempfile.TemporaryDirectory() as tmp:
        doc = run_select(flawed, SelectConfig(runs=2), seed=0, out_dir=Path(tmp)).document
    out["selected"] = {c.name: {"cov": round(c.mean_cov or 0, 3), "delta": round(c.mean_delta or 0, 3)}
                       for c in doc.selected()}
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
