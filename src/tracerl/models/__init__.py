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

from tracerl.models.chat import ChatFormat, ChatState
from tracerl.models.generation import GenerationRequest, GenerationResult, generate
from tracerl.models.local import LocalPolicy, load_model
from tracerl.models.parsing import ParsedMessage, parse_assistant_text
from tracerl.models.remote import RemotePolicy, RemotePolicyError
from tracerl.models.tiny_agent import TINY_AGENT_DIR

__all__ = [
    "TINY_AGENT_DIR", "ChatFormat", "ChatState", "GenerationRequest", "GenerationResult", "LocalPolicy",
    "ParsedMessage", "RemotePolicy", "RemotePolicyError", "generate", "load_model", "parse_assistant_text",
]
