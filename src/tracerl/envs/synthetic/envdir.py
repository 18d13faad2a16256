"""The environment directory: `envs/<capability>/`, everything needed to rebuild the environment.

    envs/<capability>/
      env.json          EnvSpec: capability, description, source ("template" | "llm"), template or
                        module, target name, difficulty, hint_fraction, max_turns
      target.json       TargetFile: the target's name, prompt title and tool schemas (tools.json entries)
      checks.json       CheckReport: the requirement checks it passed (see `tracerl.envs.synthetic.checks`)
      calibration.json  written by calibration (see `tracerl.synthesis.calibration`)
      env.py            LLM-written environments only: a module defining `make_env(difficulty) -> Env`

`load_env_dir(path)` returns a zero-argument factory of fresh `Env`s; the target is read from
target.json, so the directory does not depend on where the original tools.json was. Each JSON file is
read and written through its model in `tracerl.contracts`. `env_digest(path)` identifies the
environment by the content of the files that define it.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from tracerl.contracts import CheckReport, EnvSpec, TargetFile
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.envs.base import Env
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


def load_env_dir(path: str | Path, difficulty: int | None = None) -> Callable[[], Env]:
    """A factory of fresh environments from an env directory (`difficulty` overrides env.json's)."""
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
    make_env = load_module_factory(path / str(spec.module))
    return lambda: make_env(level)


def load_module_factory(module_path: Path) -> Callable[[int], Env]:
    """`make_env` of an environment module (imported under a name unique to its content)."""
    if not module_path.exists():
        raise InputError("no such file", path=str(module_path))
    digest = hashlib.sha256(module_path.read_bytes()).hexdigest()[:12]
    name = f"tracerl_envmod_{digest}"
    spec = importlib.util.spec_from_file_location(name, module_path)
    if spec is None or spec.loader is None:
        raise InputError("cannot import", path=str(module_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make_env = getattr(module, "make_env", None)
    if not callable(make_env):
        raise InputError("defines no make_env(difficulty)", path=str(module_path))
    return make_env
