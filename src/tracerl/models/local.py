"""The local policy backend: a Hugging Face causal LM (optionally with PEFT LoRA adapters) in-process.

    model, tokenizer = load_model("path/or/hub-name")           # or the embedded tiny agent
    policy = LocalPolicy(model, tokenizer, temperature=0.7, seed=0)
    policy.load_adapter("precondition", "adapters/precondition")  # a PEFT directory
    replies = policy.act(sessions)    # session.adapter picks the adapter per row; None = base

Adapters are PEFT LoRA adapters held by name inside one `PeftModel`; a batch may mix them (PEFT's
mixed-batch `adapter_names`), the base model being `None`. A trainer can instead hand over the
`PeftModel` it is training: sampling reads its current weights (eval mode and no grad during
generation, the previous mode restored after). Any other module with the HF causal-LM forward
(a composed model) can serve named routes: `LocalPolicy(model, tok, routes={"composed": module})`;
sessions whose adapter names a route are batched through that module.

KV reuse (`kv_reuse=True`): each session keeps the KV cache of its conversation between turns
(in `session.state`), so a turn only runs the new user/tool tokens through the model, not the whole
conversation again. It costs memory per live session (layers × 2 × kv_heads × head_dim × length
values) and is dropped when adapters change; turn it off for large models with many sessions.
When the model is trained in place between turns of a live session, call with fresh sessions.

Engines: `engine="continuous"` (the default) lets `tracerl.envs.runner.rollout` play all its
episodes through one running batch (`tracerl.models.continuous`: a turn leaves the batch when it
ends, the episode's next turn joins when the environment has answered; a KV cache per episode, each
the longest one's length, or with `kv_cache_tokens` blocks from a pool of that many tokens; the shared
prompt prefix run once). Records and seeds are those of `act`. Models it
cannot serve (flash attention, sliding-window layers) and subclasses that change `act`, `_request` or
`generate_requests` (unless they declare `samples_continuously`, as `ComposedPolicy` does) use `act`
in lockstep, as does `engine="lockstep"`.

Sampling: temperature (0 = greedy), top-p, `max_new_tokens`, one `torch.Generator` per session
seeded from (policy seed, session number) — reruns with the same seed and the same call order
give the same episodes. Log-probs follow `logprobs_mode` (see `tracerl.models.generation`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from peft import PeftConfig, PeftModel, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import _get_submodules
from peft.utils.other import AuxiliaryTrainingWrapper
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat, ChatState
from tracerl.models.continuous import PolicyTurns, supports_continuous
from tracerl.models.generation import GenerationRequest, LogprobsMode, generate
from tracerl.models.lora_check import adapter_shapes, check_adapter
from tracerl.models.placement import resolve_device, torch_dtype
from tracerl.models.tiny_agent import TINY_AGENT_DIR
from tracerl.models.tiny_code_agent import TINY_CODE_AGENT_DIR

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch
EMBEDDED_AGENT = "tiny-agent"  # the name adapters of the embedded agent record as their base
CODE_AGENT = "tiny-code-agent"  # the tiny code agent (tracerl.models.tiny_code_agent), likewise
SHIPPED_AGENTS = {EMBEDDED_AGENT: TINY_AGENT_DIR, CODE_AGENT: TINY_CODE_AGENT_DIR}  # name -> its folder in the package


def load_model(path_or_name: str | Path, device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) via `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained`, in eval mode.

    `device` and `dtype` are `tracerl.models.placement` names or torch objects (None: "auto", the first
    GPU if any and the checkpoint's own precision). `path_or_name` "tiny-agent" (or "tiny") is the
    embedded agent shipped in the package; a path ending in ".gguf" is a GGUF file, dequantized by
    transformers (`gguf_file=`; needs the `gguf` package). A PEFT
    adapter directory loads its base model (from `adapter_config.json`) with the adapter merged into
    its weights: the model is the adapted one whatever asks it, where an attached adapter would be
    passed over by a `LocalPolicy` session naming no adapter (that plays the base). Errors (missing
    path, not a model) are `InputError`s.
    """
    hf_logging.disable_progress_bar()  # our commands draw their own progress
    path = resolve_model_path(path_or_name)
    device = resolve_device(device)
    dtype = torch_dtype(dtype)
    adapter_config = Path(path) / "adapter_config.json"
    try:
        if adapter_config.exists():
            adapter_shapes(path)  # a damaged adapter fails before its base loads
            named = PeftConfig.from_pretrained(path).base_model_name_or_path
            if not named:
                raise InputError("the adapter does not name its base model (base_model_name_or_path)",
                                 path=str(adapter_config))
            base_path = resolve_model_path(named)
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
            check_adapter(base, path)
            model = PeftModel.from_pretrained(base, path).merge_and_unload()
            tokenizer = AutoTokenizer.from_pretrained(base_path)
        elif path.endswith(".gguf"):  # a GGUF file (llama.cpp's format), dequantized by transformers
            folder, name = os.path.split(os.path.abspath(path))
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(path)
            shipped = shipped_agent_name(path)
            if shipped is not None:  # adapters record the name, not this checkout's path
                model.name_or_path = model.config.name_or_path = shipped
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, SafetensorError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise InputError(f"cannot load a causal LM from '{path_or_name}': {first[:300]}") from None
    model.to(device)
    model.eval()
    return model, tokenizer


def strip_adapter_layers(model: torch.nn.Module) -> None:
    """Undo what a failed PEFT load injected into a plain model: each tuner layer or wrapper is replaced
    by the module it wraps, and the PEFT config PEFT attached is removed."""
    replaced: list[str] = []
    for name, module in list(model.named_modules()):  # outer modules first: what is inside a replaced one goes with it
        if any(name.startswith(outer + ".") for outer in replaced):
            continue
        if isinstance(module, BaseTunerLayer):
            original = module.get_base_layer()
        elif isinstance(module, AuxiliaryTrainingWrapper):
            original = module.original_module
        else:
            continue
        parent, _, child = _get_submodules(model, name)
        setattr(parent, child, original)
        replaced.append(name)
    for attribute in ("peft_config", "_hf_peft_config_loaded"):
        model.__dict__.pop(attribute, None)


def resolved_dtype(base: str, dtype: str | None) -> str:
    """The precision `load_model(base, dtype=dtype)` loads in, named, without loading the weights: `dtype`
    itself, or for "auto" the checkpoint config's `dtype` (a PEFT adapter directory: its base's); "auto"
    when the config states none (transformers then takes the weights' own)."""
    if dtype not in (None, "auto"):
        torch_dtype(dtype)  # an unknown name is an InputError
        return str(dtype)
    path = resolve_model_path(base)
    if path.endswith(".gguf"):
        return "auto"  # a GGUF file is dequantized in the precision transformers picks
    try:
        if (Path(path) / "adapter_config.json").exists():
            path = resolve_model_path(PeftConfig.from_pretrained(path).base_model_name_or_path)
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot read the model config of '{base}': {str(e).splitlines()[0]}") from None
    found = getattr(config, "dtype", None)
    if found is None:
        return "auto"
    return str(found).removeprefix("torch.")


def resolve_model_path(path_or_name: str | Path) -> str:
    """The embedded agent's directory for "tiny-agent"/"tiny", the tiny code agent's for "tiny-code-agent";
    otherwise the argument unchanged."""
    if str(path_or_name) in ("tiny", "tiny_agent"):
        return str(TINY_AGENT_DIR)
    return str(SHIPPED_AGENTS.get(str(path_or_name), path_or_name))


def shipped_agent_name(path: str | Path) -> str | None:
    """The name of the shipped agent whose directory `path` is in this installation, else None."""
    return next((name for name, folder in SHIPPED_AGENTS.items() if os.path.realpath(path) == os.path.realpath(folder)),
                None)


def is_embedded_agent(path: str | Path) -> bool:
    """Whether `path` is the embedded agent's directory in this installation."""
    return shipped_agent_name(path) == EMBEDDED_AGENT


class LocalPolicy:
    """`tracerl.core.policy.Policy` over an in-process causal LM. See the module docstring."""
    # A class that declares this makes its act / _request / generate_requests ones the continuous
    # engine reproduces; a subclass that overrides them without declaring it samples in lockstep.
    samples_continuously: ClassVar[bool] = True

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int = 0,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        routes: dict[str, torch.nn.Module] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        max_batch_size: int = 64,
        kv_reuse: bool = True,
        engine: str = "continuous",
        name: str = "model",
        kv_cache_tokens: int | None = None,
    ):
        if engine not in ("continuous", "lockstep"):
            raise InputError(f"unknown sampling engine '{engine}' (continuous or lockstep)")
        self.engine = engine
        self.model = model
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, template_kwargs=template_kwargs)
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self.routes = dict(routes or {})
        self.max_batch_size = max_batch_size
        self.kv_cache_tokens = kv_cache_tokens  # the continuous engine's key-value budget (None: unbounded)
        self.name = name
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.chat.end_of_turn_id
        self.max_context = context_length(model)
        self.kv_reuse = kv_reuse
        self._sessions_seen = 0
        self._weights_version = 0  # bumped when adapters change: reused KV caches are then stale

    # --- adapters -------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        """Names of the LoRA adapters held by the model, plus the routes."""
        names = list(getattr(self.model, "peft_config", {}) or {})
        return sorted(set(names) | set(self.routes))

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load (or replace) the PEFT LoRA adapter `name` from a PEFT directory."""
        if name == BASE or name in self.routes:
            raise InputError(f"adapter name '{name}' is reserved")
        check_adapter(self.model, path)  # damaged, or of another base: refused before the model is touched
        self._weights_version += 1
        if isinstance(self.model, PeftModel) and name in self.model.peft_config:
            self.unload_adapter(name)
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(str(path), adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
        except Exception as e:  # noqa: BLE001 — whatever PEFT left half-registered goes, then one line
            if isinstance(self.model, PeftModel) and name in self.model.peft_config:
                self.unload_adapter(name)
            elif not isinstance(self.model, PeftModel):
                strip_adapter_layers(self.model)
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise InputError(f"cannot load the adapter: {first[:300]}", path=str(path)) from None
        self.model.eval()

    def unload_adapter(self, name: str) -> None:
        """Remove adapter `name` (the base weights are untouched)."""
        self._weights_version += 1
        if name in self.routes:
            del self.routes[name]
            return
        if name not in self.adapters:
            raise InputError(f"unknown adapter '{name}'")
        peft_model = self.model
        if len(peft_model.peft_config) == 1:  # PEFT cannot delete the last adapter: drop the wrapper
            self.model = peft_model.unload()
            return
        if name in peft_model.active_adapters:
            other = next(a for a in peft_model.peft_config if a != name)
            peft_model.set_adapter(other)
        peft_model.delete_adapter(name)

    def set_adapter_weights(self, name: str, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy LoRA weights (a PEFT adapter state dict, as `get_peft_model_state_dict` returns) into
        adapter `name` in place — for a trainer that keeps its own copy of the adapter."""
        if name not in getattr(self.model, "peft_config", {}):
            raise InputError(f"unknown adapter '{name}'")
        self._weights_version += 1
        result = set_peft_model_state_dict(self.model, state_dict, adapter_name=name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter '{name}': unexpected keys {unexpected[:3]}")

    # --- policy ---------------------------------------------------------------------------
    def act(self, sessions: list[Session]) -> list[Message]:
        prompts = [self.chat.prepare(s) for s in sessions]
        replies: list[Message | None] = [None] * len(sessions)
        requests: list[GenerationRequest | None] = []
        for s, ids in zip(sessions, prompts, strict=True):
            self._check_adapter(s.adapter)
            budget = min(self.max_new_tokens, self.max_context - len(ids))
            requests.append(self._request(s, ids, budget) if budget > 0 else None)
        results = self.generate_requests([r for r in requests if r is not None])
        it = iter(results)
        for k, (s, req) in enumerate(zip(sessions, requests, strict=True)):
            if req is None:  # context full: an empty reply; the record says why
                s.info["context_overflow"] = True
                s.state.messages_recorded = len(s.messages) + 1
                replies[k] = Message.assistant(content="")
                continue
            res = next(it)
            if res.past is not None:
                covered = (req.prompt_ids + res.token_ids)[: res.past.length]
                s.state.extra["kv"] = (self._weights_version, s.adapter, res.past, covered)
            replies[k] = self.chat.record(s, res.token_ids, res.logprobs).message
        return [r for r in replies if r is not None]

    def turns(self, max_rows: int) -> Any:
        """A continuous batch of up to `max_rows` live sessions for the runner, or None where this
        policy samples in lockstep (see the module docstring)."""
        if self.engine != "continuous":
            return None
        cls = type(self)
        owner = next(c for c in cls.__mro__ if c.__dict__.get("samples_continuously"))
        if any(getattr(cls, m) is not getattr(owner, m) for m in ("act", "generate_requests", "_request")):
            return None
        if not all(supports_continuous(m) for m in [self.model, *self.routes.values()]):
            return None
        return PolicyTurns(self, max_rows=min(max_rows, self.max_batch_size))

    def continuous_forward_kwargs(self, route: str | None):
        """The continuous sampler's per-row forward arguments for the model behind `route` (None: the
        policy's model, its adapters picked per row)."""
        return None if route is not None else self._adapter_kwargs()

    def generate_requests(self, requests: list[GenerationRequest]) -> list:
        """Run requests (their `extra` = adapter/route name or None) grouped by backing module."""
        results: list = [None] * len(requests)
        groups: dict[str | None, list[int]] = {}
        for i, r in enumerate(requests):
            key = r.extra if r.extra in self.routes else None
            groups.setdefault(key, []).append(i)
        for key, index in groups.items():
            module = self.routes[key] if key is not None else self.model
            kwargs = None if key is not None else self._adapter_kwargs()
            for start in range(0, len(index), self.max_batch_size):
                chunk = index[start:start + self.max_batch_size]
                out = generate(module, [requests[i] for i in chunk], pad_id=self.pad_id,
                               logprobs_mode=self.logprobs_mode, forward_kwargs=kwargs)
                for i, res in zip(chunk, out, strict=True):
                    results[i] = res
        return results

    def _adapter_kwargs(self):
        if not getattr(self.model, "peft_config", None):
            return None

        mixes = can_mix_adapters(self.model)

        def kwargs(extras: list[Any]) -> dict[str, Any]:
            names = [e if e is not None else BASE for e in extras]
            same = bool(names) and all(n == names[0] for n in names)
            if same and list(self.model.active_adapters) == names[:1]:
                return {}  # every row on the active adapter: PEFT's plain forward, not its per-row routing
            if mixes:
                return {"adapter_names": names}
            if same and names[0] != BASE:
                self.model.set_adapter(names[0])
                return {}
            raise InputError("this model's adapters adapt fused expert weights (PEFT target_parameters), which PEFT "
                             "cannot mix in one batch: play one adapter per batch (rows " + ", ".join(sorted(set(names))) + ")")

        return kwargs

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is not None and adapter not in self.adapters:
            raise InputError(f"unknown adapter '{adapter}' (loaded: {', '.join(self.adapters) or 'none'})")

    def _request(self, session: Session, ids: list[int], budget: int) -> GenerationRequest:
        state: ChatState = session.state
        gen = state.extra.get("generator")
        if gen is None:
            gen = torch.Generator(device=_device(self.model))
            gen.manual_seed(session_seed(self.seed, self._sessions_seen))
            self._sessions_seen += 1
            state.extra["generator"] = gen
        past = None
        kv = state.extra.pop("kv", None)
        if self.kv_reuse and kv is not None:
            version, adapter, cached, covered = kv
            if version == self._weights_version and adapter == session.adapter and cached.length < len(ids) and ids[: cached.length] == covered:
                past = cached
        return GenerationRequest(
            prompt_ids=ids, max_new_tokens=budget, temperature=self.temperature, top_p=self.top_p,
            stop_ids=self.chat.stop_ids, generator=gen, extra=session.adapter, past=past, keep_cache=self.kv_reuse,
        )


def can_mix_adapters(model: torch.nn.Module) -> bool:
    """Whether PEFT can run rows of different adapters in one batch (`adapter_names`): not where an adapter
    adapts fused expert weights (`target_parameters`, a mixture-of-experts base)."""
    return not any(type(m).__name__ == "ParamWrapper" for m in model.modules())


def session_seed(seed: int, index: int) -> int:
    """A 63-bit seed for session `index` of a policy seeded with `seed` (NumPy's SeedSequence)."""
    return int(np.random.SeedSequence([int(seed) & (2**63 - 1), index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def context_length(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    return int(getattr(config, "max_position_embeddings", None) or 1 << 30)


def _device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
