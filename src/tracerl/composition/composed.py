"""Put N LoRA adapters into one Hugging Face causal LM and route between them.

`compose(model, adapters, capabilities, mode=…)` modifies `model` in place and returns a
`Composition`, also reachable as `model.tracerl_composition`. The model stays an ordinary HF
causal LM — `forward(input_ids, attention_mask=…, past_key_values=…, use_cache=…)`, `generate`,
the KV cache — because the composition only swaps each adapted `nn.Linear` for a
`GatedLoRALinear` and adds a forward pre-hook to every decoder layer that sets the slot weights
of that layer's tokens:

- `moe`: a gate `Linear(hidden, N+1)` per decoder layer reads the layer's input hidden state
  (RMS-normalised, no parameters: `rms_normalised`) and picks one slot per token (top-1; slot 0 = no adapter). While the gates train, the chosen
  expert's output is multiplied by its gate probability (Switch Transformer), so gradients reach
  the gate; in eval mode the choice is hard (weight 1).
- `router` / `merge`: task-level routing; `task_weights` (batch, N+1) applies to every token of a
  sequence — one-hot for the top-1 adapter, α over the top-p labels for a weighted merge
  (equal to W' = W + Σ α_c scaling_c B_c A_c, computed low-rank). `route_requests(conversations)`
  sets them from the zero-shot task router.

Base weights and adapters are frozen; only the gates are parameters that train.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from tracerl.composition.adapters import LoRAAdapter, check_adapters
from tracerl.composition.layers import GatedLoRALinear, LayerRoute
from tracerl.core.errors import InputError

Mode = Literal["moe", "router", "merge"]
MODES: tuple[str, ...] = ("moe", "router", "merge")


class Capability(BaseModel):
    """A capability served by one adapter; its slot is its position in the composition + 1."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""


def gate_parameter_count(num_layers: int, hidden_size: int, num_slots: int) -> int:
    """Parameters of the token-level gates: layers × (hidden·slots + slots), slots = N + 1."""
    return num_layers * (hidden_size * num_slots + num_slots)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of an HF causal LM (`model.model.layers`, as in Qwen3/Llama)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise InputError(f"{type(model).__name__} has no model.layers: only Qwen3/Llama-style causal LMs can be composed")
    return layers


class Composition:
    """The routing state of a composed model (see the module docstring)."""

    def __init__(self, model: nn.Module, adapters: list[LoRAAdapter], capabilities: list[Capability], mode: Mode):
        self.model = model
        self.adapters = adapters
        self.capabilities = capabilities
        self.mode: Mode = mode
        self.num_slots = len(adapters) + 1
        self.routes: list[LayerRoute] = []
        self.gates: nn.ModuleList | None = None
        self.force_slots: int | torch.Tensor | None = None  # override the gates: a slot, or (batch, seq) slots
        self.task_weights: torch.Tensor | None = None  # (batch, num_slots) for router/merge; None = base
        self.record: list[torch.Tensor] | None = None  # when a list, gate logits of each layer call land here
        self.last_slots: list[torch.Tensor] = []  # per layer, the slots of the latest forward's tokens
        self.router: Any = None  # a TaskRouter (router/merge modes), set by the loader
        self.top_p: float = 0.9
        self.spec: Any = None  # the CompositionSpec a loaded composition came from
        self._base_only = False

    # --- slots ------------------------------------------------------------------------------
    @property
    def slot_names(self) -> list[str]:
        return ["base"] + [c.name for c in self.capabilities]

    def slot_of(self, capability: str) -> int:
        names = self.slot_names
        if capability not in names:
            raise InputError(f"unknown capability {capability!r}; the composition has {names[1:]}")
        return names.index(capability)

    # --- per-layer routing --------------------------------------------------------------------
    def _layer_weights(self, index: int, hidden: torch.Tensor) -> torch.Tensor | None:
        if self._base_only:
            return None
        batch, seq = hidden.shape[:2]
        if self.mode == "moe":
            return self._gate_weights(index, hidden)
        if self.task_weights is None:
            return None
        if self.task_weights.shape[0] != batch:
            raise RuntimeError(f"task_weights hold {self.task_weights.shape[0]} rows but the batch has {batch}")
        weights = self.task_weights.to(device=hidden.device, dtype=hidden.dtype)
        return weights[:, None, :].expand(batch, seq, self.num_slots)

    def _gate_weights(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        assert self.gates is not None
        gate = self.gates[index]
        logits = gate(rms_normalised(hidden.to(gate.weight.dtype)))
        if self.record is not None:
            self.record.append(logits)
        if self.force_slots is None:
            slots = logits.argmax(dim=-1)
        elif isinstance(self.force_slots, int):
            slots = torch.full(logits.shape[:-1], self.force_slots, dtype=torch.long, device=logits.device)
        else:
            slots = self.force_slots.to(logits.device)
        if len(self.last_slots) > index:
            self.last_slots[index] = slots.detach()
        else:
            self.last_slots.append(slots.detach())
        one_hot = torch.nn.functional.one_hot(slots, self.num_slots).to(logits.dtype)
        if gate.training:  # Switch: scale the chosen expert by its probability so the gate gets gradients
            probs = logits.softmax(dim=-1)
            one_hot = one_hot * probs.gather(-1, slots.unsqueeze(-1))
        return one_hot.to(hidden.dtype)

    def _install_hooks(self) -> None:
        for index, layer in enumerate(decoder_layers(self.model)):
            route = self.routes[index]

            def hook(module: nn.Module, args: tuple, kwargs: dict, index: int = index, route: LayerRoute = route):
                hidden = args[0] if args else kwargs["hidden_states"]
                route.weights = self._layer_weights(index, hidden)

            layer.register_forward_pre_hook(hook, with_kwargs=True)

    # --- task-level routing ---------------------------------------------------------------------
    @contextmanager
    def base_only(self) -> Iterator[None]:
        """Run the plain base model (no adapter on any token) inside this block."""
        previous, self._base_only = self._base_only, True
        try:
            yield
        finally:
            self._base_only = previous

    def weights_for(self, conversations: list[list[Any]]) -> torch.Tensor | None:
        """Router/merge modes: routing weights (batch, N+1) from each conversation's first user turn,
        one-hot on the router's top label (router) or α over the top-p labels (merge); None in moe mode."""
        if self.mode == "moe":
            return None
        if self.router is None:
            raise RuntimeError("this composition has no task router (load it with load_composed)")
        with self.base_only():
            alpha = self.router.alphas(conversations)
        return top1_weights(alpha) if self.mode == "router" else top_p_weights(alpha, self.top_p)

    def auto_routes(self) -> bool:
        """Whether calls without explicit weights route themselves on prefill (see `_accept_routing_weights`)."""
        return self.mode != "moe" and self.router is not None and self.task_weights is None and not self._base_only

    def route_on_prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Routing weights (batch, N+1) for templated prompts given as token ids (padding masked out)."""
        rows = []
        for row in range(input_ids.shape[0]):
            ids = input_ids[row] if attention_mask is None else input_ids[row][attention_mask[row].bool()]
            rows.append(ids.tolist())
        return self.weights_for_prompt_ids(rows).to(input_ids.device)

    def weights_for_prompt_ids(self, prompts: list[list[int]]) -> torch.Tensor:
        """Routing weights for ChatML-templated prompts; each must contain its whole first user turn."""
        if self.router is None:
            raise RuntimeError("this composition has no task router (load it with load_composed)")
        texts = []
        for ids in prompts:
            request = first_user_turn_of_text(self.router.tokenizer.decode(ids, skip_special_tokens=False))
            if request is None:
                raise RuntimeError(
                    "a router/merge composed model must see each prompt's whole first user turn in its first call "
                    "(a sampler that prefills a shared prefix first cannot route it): use ComposedPolicy or pass routing_weights="
                )
            texts.append(request)
        with self.base_only():
            alpha = self.router.label_logits(texts).softmax(dim=-1)
        return top1_weights(alpha) if self.mode == "router" else top_p_weights(alpha, self.top_p)

    def route_requests(self, conversations: list[list[Any]]) -> torch.Tensor | None:
        """Set `task_weights` for the next forward calls on this batch (see `weights_for`)."""
        self.task_weights = self.weights_for(conversations)
        return self.task_weights

    def forward_kwargs(self, extras: list[Any]) -> dict[str, Any]:
        """`generate(..., forward_kwargs=composition.forward_kwargs)` with each request's `extra` a tuple
        of its N+1 routing weights: the running rows' weights as one (rows, N+1) tensor."""
        if self.mode == "moe" or not extras or any(e is None for e in extras):
            return {}
        device = next(self.model.parameters()).device
        return {"routing_weights": torch.tensor([list(e) for e in extras], dtype=torch.float32, device=device)}

    # --- checks -----------------------------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.gates.parameters()) if self.gates is not None else []

    def assert_frozen(self) -> None:
        """Raise unless the gates are the only parameters of the model that require gradients."""
        gate_ids = {id(p) for p in self.trainable_parameters()}
        leaks = [name for name, p in self.model.named_parameters() if p.requires_grad and id(p) not in gate_ids]
        if leaks:
            raise RuntimeError(f"base or adapter parameters are trainable: {leaks[:5]}")

    def gate_parameter_count(self) -> int:
        return sum(p.numel() for p in self.trainable_parameters())


def rms_normalised(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """h / RMS(h) per token, without parameters: the gates see the residual stream at unit scale,
    whatever a model's residual norms (0.3 in the embedded agent, hundreds in large models)."""
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + eps)


def first_user_turn_of_text(text: str) -> str | None:
    """The first user turn of a ChatML-rendered prompt (`<|im_start|>user\n…<|im_end|>`); None if it is not complete."""
    match = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text, flags=re.S)
    return match.group(1) if match else None


def top1_weights(alpha: torch.Tensor) -> torch.Tensor:
    """One-hot on each row's most probable label (slot 0 = base: no adapter)."""
    return torch.nn.functional.one_hot(alpha.argmax(dim=-1), alpha.shape[-1]).to(alpha.dtype)


def top_p_weights(alpha: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep each row's smallest set of labels whose probability sums to ≥ top_p; renormalise over it.

    The base label's share stays in the normalisation but adds nothing (slot 0 has no adapter).
    """
    if not 0.0 < top_p <= 1.0:
        raise InputError(f"top_p must be in (0, 1], got {top_p}")
    sorted_alpha, order = alpha.sort(dim=-1, descending=True)
    before = sorted_alpha.cumsum(dim=-1) - sorted_alpha
    keep_sorted = before < top_p - 1e-12
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = alpha * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def compose(
    model: nn.Module,
    adapters: list[LoRAAdapter],
    capabilities: list[Capability] | None = None,
    *,
    mode: Mode = "moe",
    base_ref: str | None = None,
    gate_init_std: float = 0.0,
    seed: int = 0,
) -> Composition:
    """Install `adapters` into `model` (in place, frozen) and return the composition.

    `capabilities[i]` describes `adapters[i]` (slot i+1); by default each adapter's name. Gates
    (moe mode) start with weights drawn from N(0, gate_init_std²) under `seed` and zero bias; the
    default 0 makes every token choose slot 0, i.e. the untrained composition is the base model.
    """
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if getattr(model, "tracerl_composition", None) is not None:
        raise InputError("the model is already composed")
    check_adapters(model, adapters, base_ref)
    if capabilities is None:
        capabilities = [Capability(name=a.name) for a in adapters]
    check_capabilities(capabilities, adapters)
    for p in model.parameters():
        p.requires_grad_(False)
    layers = decoder_layers(model)
    composition = Composition(model, adapters, capabilities, mode)
    composition.routes = [LayerRoute() for _ in layers]
    layer_prefix = {f"model.layers.{i}.": i for i in range(len(layers))}
    targets = sorted({name for a in adapters for name in a.modules})
    for name in targets:
        index = next((i for prefix, i in layer_prefix.items() if name.startswith(prefix)), None)
        if index is None:
            raise InputError(f"adapter target {name} is outside the decoder layers; only layer linears can be routed")
        experts = {slot: a.modules[name] for slot, a in enumerate(adapters, start=1) if name in a.modules}
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, GatedLoRALinear(getattr(parent, child), experts, composition.routes[index]))
    if mode == "moe":
        hidden = model.config.hidden_size
        param = next(model.parameters())
        generator = torch.Generator().manual_seed(seed)
        gates = nn.ModuleList()
        for _ in layers:
            gate = nn.Linear(hidden, composition.num_slots)
            with torch.no_grad():
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * gate_init_std)
                gate.bias.zero_()
            gates.append(gate.to(param.device))
        gates.train(model.training)
        composition.gates = gates
        model.tracerl_gates = gates  # a registered submodule: moves with model.to(...)
    composition._install_hooks()
    _accept_routing_weights(model, composition)
    model.tracerl_composition = composition
    composition.assert_frozen()
    return composition


def _accept_routing_weights(model: nn.Module, composition: Composition) -> None:
    """Per-call task routing for router/merge modes, so the model works in any batched sampler.

    - `model(…, routing_weights=W)` uses the weights W (batch, N+1) for that call only
      (`ComposedPolicy` passes the rows still running through `Composition.forward_kwargs`).
    - Otherwise, when the composition has a router and no fixed `task_weights`, a prefill call
      (no cache yet) routes every row from its own prompt — the first user turn found in the
      decoded ChatML prompt (`route_on_prefill`) — and the weights travel with the returned KV
      cache: `cache.batch_select_indices` / `batch_repeat_interleave` (a sampler dropping finished
      rows, beam search) select them too, and later calls with that cache reuse them.
    """
    original = model.forward

    def forward(*args: Any, routing_weights: torch.Tensor | None = None, **kwargs: Any) -> Any:
        attach = None
        if routing_weights is None and composition.auto_routes():
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            routing_weights = getattr(cache, "tracerl_routing_weights", None)
            if routing_weights is None:
                if cache is not None and cache.get_seq_length() > 0:
                    raise RuntimeError("a KV cache without routing weights: prefill the whole prompt through this model first")
                input_ids = kwargs.get("input_ids", args[0] if args else None)
                if input_ids is not None:
                    routing_weights = attach = composition.route_on_prefill(input_ids, kwargs.get("attention_mask"))
        if routing_weights is None:
            return original(*args, **kwargs)
        previous, composition.task_weights = composition.task_weights, routing_weights
        try:
            out = original(*args, **kwargs)
        finally:
            composition.task_weights = previous
        cache = getattr(out, "cache", None)  # transformers ≥ 5.2x; `past_key_values` before
        if cache is None:
            cache = getattr(out, "past_key_values", None)
        if attach is not None and cache is not None:
            _carry_weights(cache, attach)
        return out

    signature = inspect.signature(original)
    extra = inspect.Parameter("routing_weights", inspect.Parameter.KEYWORD_ONLY, default=None)
    params = list(signature.parameters.values())
    where = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    forward.__signature__ = signature.replace(parameters=params[:where] + [extra] + params[where:])  # type: ignore[attr-defined]
    forward.__doc__ = original.__doc__
    model.forward = forward


def _carry_weights(cache: Any, weights: torch.Tensor) -> None:
    """Keep per-row routing weights on a KV cache, selected and repeated with its rows."""
    cache.tracerl_routing_weights = weights
    select, repeat = cache.batch_select_indices, cache.batch_repeat_interleave

    def batch_select_indices(indices: torch.Tensor) -> None:
        select(indices)
        cache.tracerl_routing_weights = cache.tracerl_routing_weights.index_select(0, indices.to(weights.device))

    def batch_repeat_interleave(repeats: int) -> None:
        repeat(repeats)
        cache.tracerl_routing_weights = cache.tracerl_routing_weights.repeat_interleave(repeats, dim=0)

    cache.batch_select_indices = batch_select_indices
    cache.batch_repeat_interleave = batch_repeat_interleave


def check_capabilities(capabilities: list[Capability], adapters: list[LoRAAdapter]) -> None:
    """One capability per adapter, same names, same order; else a clear InputError."""
    names = [c.name for c in capabilities]
    adapter_names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise InputError(f"capability names must be distinct, got {names}")
    if sorted(names) != sorted(adapter_names):
        missing = sorted(set(adapter_names) - set(names))
        extra = sorted(set(names) - set(adapter_names))
        raise InputError(
            f"the capability list does not match the adapters: adapters without a capability {missing}, "
            f"capabilities without an adapter {extra}"
        )
    if names != adapter_names:
        raise InputError(f"capabilities {names} must be in the adapters' order {adapter_names}")


def composition_of(model: Any) -> Composition:
    """The Composition of a composed model (raises for a plain model)."""
    composition = getattr(model, "tracerl_composition", None)
    if composition is None:
        raise InputError("the model is not a composed model")
    return composition
