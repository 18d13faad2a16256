"""The environment directory: `envs/<capability>/`, everything needed to rebuild the environment.

    envs/<capability>/
      env.json          EnvSpec: capability, description, source ("template" | "llm"), template or
                        module, target name, difficulty, hint_fraction, max_turns
      target.json       the target's name, prompt title and tool schemas (tools.json entries)
      checks.json       the requirement checks it passed (see `tracerl.synthesis.checks`)
      calibration.json  written by calibration (see `tracerl.synthesis.calibration`)
      env.py            LLM-written environments only: a module defining `make_env(difficulty) -> Env`

`load_env_dir(path)` returns a zero-argument factory of fresh `Env`s; the target is read from
target.json, so the directory does not depend on where the original tools.json was.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, read_json, write_json
from tracerl.envs.base import Env
from tracerl.synthesis.target import Target

ENV_JSON = "env.json"
TARGET_JSON = "target.json"
CHECKS_JSON = "checks.json"
CALIBRATION_JSON = "calibration.json"
MODULE_PY = "env.py"


class EnvSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    capability: str
    description: str = ""
    source: Literal["template", "llm"] = "template"
    template: str | None = None  # a key of tracerl.synthesis.templates.TEMPLATES
    module: str | None = None  # file in the directory defining make_env(difficulty)
    target: str  # the target's name ("airline", "retail", …)
    difficulty: int = 1
    hint_fraction: float = 0.25  # share of a GRPO group sampled with the hint (TRACE: 0.25–0.5)
    max_turns: int | None = None


def load_env_spec(path: str | Path) -> EnvSpec:
    file = Path(path) / ENV_JSON
    try:
        spec = EnvSpec.model_validate(read_json(file))
    except ValidationError as e:
        raise InputError(describe_validation_error(e), path=str(file)) from None
    if (spec.template is None) == (spec.module is None):
        raise InputError("exactly one of 'template' and 'module' must be set", path=str(file))
    return spec


def load_target_json(path: str | Path) -> Target:
    file = Path(path) / TARGET_JSON
    data = read_json(file)
    try:
        return Target.from_json(data)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"not a target description ({e})", path=str(file)) from None


def write_env_dir(path: str | Path, spec: EnvSpec, target: Target, checks: dict | None = None,
                  module_source: str | None = None) -> Path:
    """Write the directory (each file atomically); env.json last, so a directory with env.json is complete."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / TARGET_JSON, target.to_json())
    if module_source is not None:
        from tracerl.core.io import atomic_write_text

        atomic_write_text(path / (spec.module or MODULE_PY), module_source)
    if checks is not None:
        write_json(path / CHECKS_JSON, checks)
    write_json(path / ENV_JSON, spec.model_dump())
    return path


def load_env_dir(path: str | Path, difficulty: int | None = None) -> Callable[[], Env]:
    """A factory of fresh environments from an env directory (`difficulty` overrides env.json's)."""
    path = Path(path)
    spec = load_env_spec(path)
    target = load_target_json(path)
    level = spec.difficulty if difficulty is None else difficulty
    if spec.template is not None:
        from tracerl.synthesis.templates import TEMPLATES

        cls = TEMPLATES.get(spec.template)
        if cls is None:
            raise InputError(f"unknown template '{spec.template}' (known: {', '.join(sorted(TEMPLATES))})",
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
