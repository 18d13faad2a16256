"""Model runtime: chat format and tool-call parsing, policy backends, composed models, the embedded tiny agent.

- `chat`: prompting through the tokenizer's chat template with tools; exact multi-turn token
  records in `Session.tokens`. `parsing`: generated text → assistant message; never raises.
- `generation`: batched KV-cache sampling, per-row parameters, vLLM's log-prob modes;
  `continuous`: the continuous-batching engine.
- `local` (`LocalPolicy`, `load_model`): an in-process causal LM with PEFT adapters by name.
- `remote` (`RemotePolicy`): an OpenAI-compatible server (vLLM or `tracerl serve`) over token ids;
  `served`: rollouts from servers that hot-swap an adapter, and the checks that they serve it.
- `factory`: policies by spec (`tracerl collect --policy`).
- `composed`: N capability adapters in one model, routed (step 4's product).
- `tiny_agent`: the embedded agent; `build_agent` remakes it (`tracerl build-agent`).
"""
