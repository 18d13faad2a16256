"""The environment directory: `envs/<capability>/`, everything needed to rebuild the environment.

    envs/<capability>/
      env.json          EnvSpec: capability, description, source ("template" | "llm"), template or
                        module, target name, difficulty, hint_fraction, max_turns
      target.json       TargetFile: the target's name, prompt title and tool schemas (tools.json entries)
      checks.json       CheckReport: the requirement checks it passed (see `tracerl.envs.synthetic.checks`)
      calibration.json  written by calibration (see `tracerl.synthesis.calibration`)
      env.py            LLM-written environments only: a module defining `make_env(difficulty) -> Env`

`load_env_dir(path)` returns a zero-argument factory of fresh `Env`s; the target is read from
target.json, so the directory does not depend on where the original tools.json was. An LLM-written
module is never imported here: its environments live in a confined worker process and are played
through `tracerl.envs.synthetic.sandbox.SandboxedEnv`. Each JSON file is
read and written through its model in `tracerl.contracts`. `env_digest(path)` identifies the
environment by the content of the files that define it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from tracerl.contracts import CheckReport, EnvSpec, TargetFile
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.envs.base import Env
from tracerl.envs.synthetic.sandbox import (
    GeneratedCodeError,
    SandboxFailure,
    SandboxWorker,
    WorkerLimits,
)
from tracerl.envs.synthetic.target import Target
from tracerl.envs.registry import capability_envs
from tracerl.envs.synthetic.templates import TEMPLATES, template_class

ENV_JSON = "env.json"
TARGET_JSON = "target.json"
CHECKS_JSON = "checks.json"
CALIBRATION_JSON = "calibration.json"
MODULE_PY = "env.py"
DEFINING = (ENV_JSON, TARGET_JSON)  # with the module, the files `load_env_dir` builds the environment from


def load_env_spec(path: str | Path) -> EnvSpec:
    """The env.json of the environment directory `path`."""
    return EnvSpec.read(Path(path) / ENV_JSON)


def load_target_json(path: str | Path) -> Target:
    """The target of the environment directory `path` (its target.json)."""
    return Target.of_file(TargetFile.read(Path(path) / TARGET_JSON))


def write_env_dir(path: str | Path, spec: EnvSpec, target: Target, checks: CheckReport | None = None,
                  module_source: str | None = None) -> Path:
    """Write the directory (each file atomically); env.json last, so a directory with env.json is complete."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    target.file().write(path / TARGET_JSON)
    if module_source is not None:
        atomic_write_text(path / (spec.module or MODULE_PY), module_source)
    if checks is not None:
        checks.write(path / CHECKS_JSON)
    spec.write(path / ENV_JSON)
    return path


def env_digest(path: str | Path) -> str:
    """sha256 over the files that define the environment in directory `path` (env.json, target.json
    and an LLM-written module), each as its name and content: equal digests, the same environment."""
    path = Path(path)
    spec = load_env_spec(path)
    h = hashlib.sha256()
    for name in DEFINING + ((spec.module,) if spec.module else ()):
        h.update(name.encode() + b"\0" + hashlib.sha256((path / name).read_bytes()).digest())
    return h.hexdigest()


def load_env_dir(path: str | Path, difficulty: int | None = None,
                 limits: WorkerLimits | None = None) -> Callable[[], Env]:
    """A factory of fresh environments from an env directory (`difficulty` overrides env.json's). An
    LLM-written module's factory (`SandboxedEnvFactory`) owns a worker process: `close()` ends it (so
    does dropping the factory and every env it made)."""
    path = Path(path)
    spec = load_env_spec(path)
    target = load_target_json(path)
    level = spec.difficulty if difficulty is None else difficulty
    if spec.template is not None:
        cls = template_class(spec.template)
        if cls is None:
            known = sorted(TEMPLATES) + sorted(capability_envs())
            raise InputError(f"unknown template '{spec.template}' (known: {', '.join(known)})",
                             path=str(path / ENV_JSON))
        return lambda: cls(target, difficulty=level, max_turns=spec.max_turns)
    module = module_file(path, spec)
    worker = SandboxWorker(path, module.name, files=(TARGET_JSON,), limits=limits, source=str(module))
    try:
        worker.load()
    except (GeneratedCodeError, SandboxFailure) as e:
        worker.close()
        raise InputError(f"the module fails to import: {e}", path=str(module)) from None
    return worker.factory(level)


def module_file(path: Path, spec: EnvSpec) -> Path:
    """The LLM-written module of env directory `path`: a file of the folder itself, named in env.json."""
    name = str(spec.module or "")
    if not name.endswith(".py") or Path(name).name != name or name.startswith("."):
        raise InputError(f"module {name!r} is not a .py file of the directory itself", path=str(path / ENV_JSON))
    module = path / name
    if not module.is_file():
        raise InputError("no such file", path=str(module))
    return module
