"""Model runtime: chat format and tool-call parsing, policy backends, the embedded tiny agent.

    from tracerl.models import load_model, LocalPolicy, RemotePolicy, ChatFormat

- `ChatFormat` (chat.py): prompting through the tokenizer's chat template with tools; exact
  multi-turn token records in `Session.tokens`.
- `parse_assistant_text` (parsing.py): generated text → assistant message; never raises.
- `generate` (generation.py): batched KV-cache sampling, per-row parameters, vLLM's log-prob modes.
- `LocalPolicy`, `load_model` (local.py): an in-process causal LM with PEFT adapters by name.
- `RemotePolicy` (remote.py): an OpenAI-compatible server (vLLM or `tracerl serve`) over token ids.
- `TINY_AGENT_DIR` (tiny_agent/): the embedded agent; `tracerl build-agent` remakes it.
"""

_EXPORTS = {
    "ChatFormat": "tracerl.models.chat", "ChatState": "tracerl.models.chat",
    "GenerationRequest": "tracerl.models.generation", "GenerationResult": "tracerl.models.generation",
    "generate": "tracerl.models.generation", "LocalPolicy": "tracerl.models.local",
    "load_model": "tracerl.models.local", "ParsedMessage": "tracerl.models.parsing",
    "parse_assistant_text": "tracerl.models.parsing", "RemotePolicy": "tracerl.models.remote",
    "RemotePolicyError": "tracerl.models.remote", "TINY_AGENT_DIR": "tracerl.models.tiny_agent",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):  # lazy: `tracerl --help` and the commands that load no model need not import torch
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
