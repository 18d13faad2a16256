"""Policies by spec — what `tracerl collect --policy SPEC` plays:

    model                        the embedded tiny agent, greedy
    model:PATH                   any causal LM directory or hub name (or a PEFT adapter directory), greedy
    remote:URL[,URL…][#MODEL]    OpenAI-compatible servers (vLLM, `tracerl serve`), greedy (`remote_policy`)
    anything else                the environment's own reference policies (`Env.reference_policy`):
                                 the airline's 'oracle', 'flawed', 'flawed:p1[,p2[,p3[,p4]]]'

Keyword options (from code): temperature (default 0 = greedy), top_p, max_new_tokens, device,
logprobs_mode. Loaded models are cached per (path, device), so making many policies is cheap. Bad
names and arguments raise `InputError` (one line, exit code 2 from the CLI).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.envs.base import Env
from tracerl.models.local import LocalPolicy, load_model
from tracerl.models.remote import remote_policy

_CACHE: dict[tuple[str, str], tuple[Any, Any]] = {}


def model_policy(spec: str, seed: int = 0, *, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 160, device: str | None = None, logprobs_mode: str = "raw_logprobs",
                 **_: Any) -> LocalPolicy:
    name, _sep, path = spec.partition(":")
    if name.strip() != "model":
        raise ValueError(f"expected 'model' or 'model:PATH', got '{spec}'")
    path = path.strip() or "tiny-agent"
    key = (path, str(device))
    if key not in _CACHE:
        _CACHE[key] = load_model(path, device=device)
    model, tokenizer = _CACHE[key]
    label = "model" if path == "tiny-agent" else f"model:{path}"
    return LocalPolicy(model, tokenizer, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                       seed=seed, logprobs_mode=logprobs_mode, name=label)  # type: ignore[arg-type]


def make_policy(spec: str, *, seed: int = 0, make_env: Callable[[], Env] | None = None, **options: Any) -> Policy:
    """The policy `spec` names (see the module docstring); `seed` makes its choices reproducible; `make_env`
    makes the environment it will play, whose reference policies the other specs name."""
    spec = spec.strip()
    name = spec.partition(":")[0].strip()
    try:
        if name == "model":
            return model_policy(spec, seed=seed, **options)
        if name == "remote":
            return remote_policy(spec, seed=seed, **options)
        if make_env is None:
            raise InputError(f"unknown policy '{spec}' (model, model:PATH, remote:URL, or a reference policy of the "
                             "environment)")
        return make_env().reference_policy(spec, seed=seed, **options)
    except ValueError as e:
        raise InputError(f"bad policy spec '{spec}': {e}") from None
