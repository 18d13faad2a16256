"""Policy specs for model backends, for `tracerl.envs.registry.make_policy`:

    model                  the embedded tiny agent, greedy
    model:PATH             any causal LM directory or hub name (or a PEFT adapter directory)

Keyword options (from code): temperature (default 0 = greedy), top_p, max_new_tokens, device,
logprobs_mode. Loaded models are cached per (path, device), so making many policies is cheap.
"""

from __future__ import annotations

from typing import Any

from tracerl.models.local import LocalPolicy, load_model

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
