"""Environments by name: the built-in domains, installed packages' entry points, and any
`package.module:factory` a user names.

    make_env("airline", split="test")             a built-in domain ("airline", "code")
    make_env("tau2:retail", user={…})             τ²-bench's own domain, played live (`tracerl.envs.tau2_live`)
    make_env("toolsandbox", settings="ts.yaml")   ToolSandBox's own scenarios, played live (`tracerl.envs.toolsandbox`)
    make_env("mypkg.envs:make_env", split="train")  a user's factory, imported by its module path
    make_env("myenv")                             an entry point of the group `tracerl.envs` (an installed
                                                  package's `[project.entry-points."tracerl.envs"]`)

A factory is called with the keyword options the caller gives (the pipeline gives `split`:
"train", "test" or None) and must return an `Env`. `register_env(name, factory)` adds one by name
from code. Every problem — an unknown name, a module that does not import, a factory that raises or
returns something else — is one `InputError` line (exit code 2 from the CLI).

`capability_envs(domain)` gives the capability environments a built-in domain brings for synthesis
(the code domain's: its own classes on its tools and tasks, not built on tool families);
`make_teacher(domain, policy, **options)` a domain's teacher for an agent builder
(`tracerl.envs.teacher.Teacher`).

This module is the one place that names particular domains.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError
from tracerl.envs.base import Env
from tracerl.envs.tau2_live import make_tau2_env
from tracerl.envs.teacher import Teacher

EnvFactory = Callable[..., Env]
ENTRY_POINT_GROUP = "tracerl.envs"
# name -> "module:attribute" of its factory, imported when first made
BUILTIN_ENVS: dict[str, str] = {"airline": "tracerl.envs.airline:AirlineEnv", "code": "tracerl.envs.code:CodeEnv",
                                "toolsandbox": "tracerl.envs.toolsandbox:make_toolsandbox_env"}
# name -> "module:attribute" of its capability environments ({capability: class(target, difficulty=…, max_turns=…)})
BUILTIN_CAPABILITY_ENVS: dict[str, str] = {"code": "tracerl.envs.code.capabilities:CAPABILITY_ENVS"}
# Benchmarks played live through their own code: they state their tool schemas and grade their episodes.
LIVE_BENCHMARKS = ("toolsandbox",)
# A benchmark's own results that `load_rollouts` reads: name -> (the results file in a run folder,
# "module:is_results" of a parsed document, "module:trajectories" of one: (doc, path=…, tools=…) -> [Trajectory])
RESULTS_READERS: dict[str, tuple[str, str, str]] = {
    "toolsandbox": ("result_summary.json", "tracerl.envs.toolsandbox:is_toolsandbox_results",
                    "tracerl.envs.toolsandbox:toolsandbox_trajectories"),
}
_REGISTERED: dict[str, EnvFactory] = {}


def register_env(name: str, factory: EnvFactory) -> None:
    """Make `factory` available as `name` (e.g. in `target.env`) in this process."""
    _REGISTERED[name] = factory


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_envs() -> dict[str, str]:
    """Every environment name known here → where its factory comes from."""
    found = {name: f"built in ({target})" for name, target in BUILTIN_ENVS.items()}
    found.update({name: f"entry point {target}" for name, target in _entry_points().items()})
    found.update({name: "registered in this process" for name in _REGISTERED})
    found["tau2:<domain>"] = "τ²-bench's own domains, played live (needs τ²-bench: see the README)"
    return found


def is_live_target(spec: str) -> bool:
    """Whether `spec` is a benchmark played live through its own code (τ²-bench's domains, ToolSandBox)."""
    return spec in LIVE_BENCHMARKS or spec.startswith("tau2:")


def benchmark_results_file(folder: Path) -> Path | None:
    """The results file of a benchmark's run folder (ToolSandBox's result_summary.json), else None."""
    return next((folder / name for name, _, _ in RESULTS_READERS.values() if (folder / name).is_file()), None)


def benchmark_of_results(doc: Any) -> str | None:
    """Which benchmark's own results file a parsed JSON document is (`RESULTS_READERS`), else None."""
    return next((name for name, (_, is_results, _) in RESULTS_READERS.items()
                 if _import_factory(is_results, name)(doc)), None)


def read_benchmark_results(benchmark: str, doc: Any, *, path: str, tools: Any = None) -> list[Any]:
    """The trajectories of `benchmark`'s own results document `doc` (read from `path`)."""
    return _import_factory(RESULTS_READERS[benchmark][2], benchmark)(doc, path=path, tools=tools)


def _import_factory(target: str, spec: str) -> EnvFactory:
    factory = _import_attribute(target, spec)
    if not callable(factory):
        raise InputError(f"environment '{spec}': '{target}' is not callable")
    return factory  # type: ignore[no-any-return]


def _import_attribute(target: str, spec: str) -> Any:
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(f"environment '{spec}': cannot import module '{module_name}' ({e})") from None
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise InputError(f"environment '{spec}': module '{module_name}' has no '{attribute}'")
    return factory


def env_factory(spec: str) -> EnvFactory:
    """The factory a name or `module:factory` spec stands for."""
    if spec in _REGISTERED:
        return _REGISTERED[spec]
    if spec in BUILTIN_ENVS:
        return _import_factory(BUILTIN_ENVS[spec], spec)
    points = _entry_points()
    if spec in points:
        return _import_factory(points[spec], spec)
    if ":" in spec and not spec.startswith("tau2:"):
        return _import_factory(spec, spec)
    known = ", ".join(sorted(n for n in available_envs() if n != "tau2:<domain>"))
    raise InputError(f"unknown environment '{spec}' (known: {known}, tau2:<domain>, or package.module:factory)")


def make_env(spec: str, **options: Any) -> Env:
    """A new environment; e.g. `make_env('airline', split='test')`, `make_env('tau2:retail', user={…})`."""
    if spec.startswith("tau2:"):  # τ²-bench's own domains played live
        return make_tau2_env(spec.partition(":")[2], **options)
    factory = env_factory(spec)
    try:
        env = factory(**options)
    except InputError:
        raise
    except Exception as e:  # a user's factory may raise anything: one line naming it
        raise InputError(f"environment '{spec}': {type(e).__name__}: {e}") from None
    if not isinstance(env, Env):
        raise InputError(f"environment '{spec}': the factory returned {type(env).__name__}, not a tracerl.envs.base.Env")
    return env


def capability_envs(domain: str | None = None) -> dict[str, Callable[..., Env]]:
    """The capability environments a built-in domain provides for synthesis, by capability name (every
    domain's when `domain` is None; none for a domain without its own), each called as
    `cls(target, difficulty=…, max_turns=…)`."""
    found: dict[str, Callable[..., Env]] = {}
    for name, target in BUILTIN_CAPABILITY_ENVS.items():
        if domain is None or domain == name:
            found.update(_import_attribute(target, name))
    return found


def make_teacher(domain: str, policy: str, **options: Any) -> Teacher:
    """`domain`'s teacher playing its reference policy `policy` with `options` (an agent builder's
    demonstrations). An unknown domain, spec or option is one `InputError` line."""
    try:
        return Teacher(domain, lambda split: make_env(domain, split=split), policy, dict(options))
    except ValueError as e:
        raise InputError(f"teacher of '{domain}': {e}") from None
