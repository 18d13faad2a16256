"""What confinement costs an LLM-written environment: checks in the sandbox, episodes through the pipe.

    python benchmarks/sandboxed_env.py [--episodes 200] [--repeats 3]

1. checks: `check_module_source` (a confined worker started, the module imported there, every
   requirement check run here over 20 seeds) for the known-good example module, one with a broken
   oracle and one with a syntax error; the best of `--repeats` runs.
2. episodes: `--episodes` oracle episodes (`checks.play`: reset, the gold calls one per step, the
   closing message) of the known-good module, played through `load_env_dir` (a `SandboxedEnv` in a
   worker: one request per reset and step) and, for comparison only, with the same module imported
   into this process (the example module is code of this repository, not generated); seconds per
   episode and per request, worker start-up included once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tracerl.contracts import EnvSpec
from tracerl.envs.synthetic.checks import play
from tracerl.envs.synthetic.envdir import load_env_dir, write_env_dir
from tracerl.synthesis.llm import EXAMPLE_MODULE, check_module_source
from tracerl.synthesis.sandbox import SandboxLimits
from tracerl.synthesis.target import load_target

BROKEN_ORACLE = EXAMPLE_MODULE.replace("Action(name=ACT.name, arguments=args)]",
                                       "Action(name=ACT.name, arguments={**args, FAMILY.id_param: 'nope'})]")


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def episodes(make_env, n: int) -> tuple[float, int]:
    start, requests = time.perf_counter(), 0
    for seed in range(n):
        env = make_env()
        actions = env.oracle(seed)
        reward, _ = play(env, seed, actions)
        assert reward == 1.0
        requests += 4 + len(actions)  # make_env, oracle, reset, a step per gold call, the closing step
    return time.perf_counter() - start, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target = load_target(str(Path(__file__).parents[1] / "tests" / "data" / "tau2" / "retail" / "tools.json"))
    load_start = os.getloadavg()
    limits = SandboxLimits(seeds=20)
    checks = {name: best_of(args.repeats, lambda source=source: check_module_source(source, target, limits))
              for name, source in (("known-good", EXAMPLE_MODULE), ("broken oracle", BROKEN_ORACLE),
                                   ("syntax error", "def make_env(:\n"))}
    with tempfile.TemporaryDirectory() as tmp:
        spec = EnvSpec(capability="example", description="d", source="llm", module="env.py", target=target.name)
        env_dir = write_env_dir(Path(tmp) / "example", spec, target, module_source=EXAMPLE_MODULE)
        start = time.perf_counter()
        factory = load_env_dir(env_dir)
        startup = time.perf_counter() - start
        sandboxed, requests = episodes(factory, args.episodes)
        factory.close()
        module_spec = importlib.util.spec_from_file_location("example_env_inprocess", env_dir / "env.py")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        in_process, _ = episodes(lambda: module.make_env(1), args.episodes)
    result = {
        "checks_s": checks,
        "worker_start_s": startup,
        "episodes": args.episodes,
        "sandboxed_s_per_episode": sandboxed / args.episodes,
        "in_process_s_per_episode": in_process / args.episodes,
        "sandboxed_ms_per_request": 1000 * (sandboxed - in_process) / requests,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
