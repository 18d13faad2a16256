"""Factories by name: environments (`make_env`) and policies (`make_policy`).

Policy specs are `NAME` or `NAME:ARGS`; the factory registered for NAME parses ARGS:

    oracle                       the airline oracle (passes every task)
    flawed                       the oracle with planted faults, 0.25 each
    flawed:p1[,p2[,p3[,p4]]]     … with these rates (missing ones are 0), each in [0, 1]
    model[:PATH]                 a causal LM (default: the embedded tiny agent), greedy (tracerl.models.factory)
    remote:URL[,URL…][#MODEL]    OpenAI-compatible servers (vLLM), greedy (tracerl.models.remote.remote_policy)

Other stages add theirs with `register_policy` (e.g. 'model:PATH') and `register_env`.
Bad names and arguments raise `InputError` (one line, exit code 2 from the CLI).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.envs.base import Env

EnvFactory = Callable[..., Env]
PolicyFactory = Callable[..., Policy]  # (spec, seed=…, **kw) -> Policy; raises ValueError on bad ARGS


def _remote(spec: str, seed: int = 0, **kw: Any) -> Policy:
    from tracerl.models.remote import remote_policy

    return remote_policy(spec, seed=seed, **kw)


def _airline(**kw: Any) -> Env:
    from tracerl.envs.airline import AirlineEnv

    return AirlineEnv(**kw)


def _scripted(spec: str, seed: int = 0, **kw: Any) -> Policy:
    from tracerl.envs.reference import scripted_policy_from_spec

    return scripted_policy_from_spec(spec, seed=seed, **kw)


def _model(spec: str, seed: int = 0, **kw: Any) -> Policy:
    from tracerl.models.factory import model_policy  # 'model' (the embedded tiny agent) or 'model:PATH'

    return model_policy(spec, seed=seed, **kw)


ENV_FACTORIES: dict[str, EnvFactory] = {"airline": _airline}
POLICY_FACTORIES: dict[str, PolicyFactory] = {"oracle": _scripted, "flawed": _scripted, "model": _model, "remote": _remote}


def register_env(name: str, factory: EnvFactory) -> None:
    ENV_FACTORIES[name] = factory


def register_policy(name: str, factory: PolicyFactory) -> None:
    """`factory(spec, seed=…, **kw)` gets the whole spec ('NAME:ARGS') and returns a Policy."""
    POLICY_FACTORIES[name] = factory


def make_env(name: str, **kw: Any) -> Env:
    """A new environment; e.g. `make_env('airline', split='test')`, `make_env('tau2:retail', user={…})`."""
    if name.startswith("tau2:"):  # τ²-bench's own domains played live (tracerl.envs.tau2_live)
        from tracerl.envs.tau2_live import make_tau2_env

        return make_tau2_env(name.partition(":")[2], **kw)
    factory = ENV_FACTORIES.get(name)
    if factory is None:
        raise InputError(f"unknown environment '{name}' (known: {', '.join(sorted(ENV_FACTORIES))})")
    try:
        return factory(**kw)
    except (TypeError, ValueError) as e:
        raise InputError(f"environment '{name}': {e}") from None


def make_policy(spec: str, *, seed: int = 0, **kw: Any) -> Policy:
    """A policy from its spec (see the module docstring); `seed` makes its choices reproducible."""
    name = spec.partition(":")[0].strip()
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise InputError(f"unknown policy '{spec}' (known: {', '.join(sorted(POLICY_FACTORIES))})")
    try:
        return factory(spec.strip(), seed=seed, **kw)
    except ValueError as e:
        raise InputError(f"bad policy spec '{spec}': {e}") from None
