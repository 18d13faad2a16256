"""Put N LoRA adapters into one Hugging Face causal LM and route between them.

`compose(model, adapters, capabilities, mode=…)` swaps each adapted `nn.Linear` of `model` (in
place) for a `GatedLoRALinear` and returns a `Composition`, also reachable as
`model.tracerl_composition`. No method of the model is replaced and no hook stays registered: the
model itself still computes the base model, and routing is per call
(`tracerl.composition.routing`) — `composition.composed_model` (what `load_composed` returns) is
the model whose every `forward` / `generate` call routes, and `with composition.routing(…):`
routes the calls of `model` inside the block.

- `moe`: a gate `Linear(hidden, N+1)` per decoder layer reads the layer's input hidden state and
  picks one slot per token (slot 0 = no adapter). `moe_routing="opening"` decides when: the gates'
  per-token majority over the episode's opening (first user turn on, as routing accuracy counts
  it) picks one slot, and every token of the episode takes it (`weights_for`).
- `router` / `merge`: task-level routing; routing weights (batch, N+1), passed with each call,
  apply to every token of a sequence — one-hot for the top-1 adapter, α over the top-p labels for
  a weighted merge (equal to W' = W + Σ α_c scaling_c B_c A_c, computed low-rank).
  `weights_for(conversations)` computes them with the zero-shot task router.

Base weights and adapters are frozen; only the gates are parameters that train.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
from pydantic import ValidationError
from torch import nn

from tracerl.composition.adapters import LoRAAdapter, check_adapters
from tracerl.composition.layers import GatedLoRALinear
from tracerl.composition.routing import ComposedModel, RoutedCall, routed
from tracerl.contracts import Capability  # served by one adapter; its slot is its position in the composition + 1
from tracerl.core.errors import InputError
from tracerl.models.chat import first_user_turn

Mode = Literal["moe", "router", "merge"]
MODES: tuple[str, ...] = ("moe", "router", "merge")
MoeRouting = Literal["token", "opening"]
MOE_ROUTINGS: tuple[str, ...] = ("token", "opening")


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
    """A composed model's adapters, capabilities, gates and task router (see the module docstring)."""

    def __init__(self, model: nn.Module, adapters: list[LoRAAdapter], capabilities: list[Capability], mode: Mode):
        self.model = model
        self.adapters = adapters
        self.capabilities = capabilities
        self.mode: Mode = mode
        self.num_slots = len(adapters) + 1
        self.layers = decoder_layers(model)
        self.linears: list[list[GatedLoRALinear]] = [[] for _ in self.layers]  # per decoder layer
        self.gates: nn.ModuleList | None = None
        self.router: Any = None  # a TaskRouter (router/merge modes), set by the loader
        self.moe_routing: MoeRouting = "token"
        self.tokenizer: Any = None  # the base's tokenizer (moe routed at the opening), set by the loader
        self.top_p: float = 0.9
        self.spec: Any = None  # the CompositionSpec a loaded composition came from
        self.composed_model = ComposedModel(model, self)

    # --- slots ------------------------------------------------------------------------------
    @property
    def slot_names(self) -> list[str]:
        return ["base"] + [c.name for c in self.capabilities]

    def slot_of(self, capability: str) -> int:
        names = self.slot_names
        if capability not in names:
            raise InputError(f"unknown capability {capability!r}; the composition has {names[1:]}")
        return names.index(capability)

    # --- routing ----------------------------------------------------------------------------
    def routing(self, routing_weights: torch.Tensor | None = None, **options: Any) -> AbstractContextManager[RoutedCall]:
        """Route the calls of `self.model` inside this block: `tracerl.composition.routing.routed`."""
        return routed(self, routing_weights, **options)

    @property
    def routes_by_weights(self) -> bool:
        """Each call takes one row of routing weights per sequence: router, merge, moe routed at the opening."""
        return self.mode != "moe" or self.moe_routing == "opening"

    def weights_for(self, conversations: list[list[Any]], tools: list[list[Any]] | None = None) -> torch.Tensor | None:
        """Routing weights (batch, N+1) from each conversation's opening: router/merge, one-hot on the
        router's top label (router) or α over the top-p labels (merge) of the first user turn; moe
        routed at the opening, one-hot on the gates' per-token majority over the opening (each
        conversation rendered with its `tools`). None for moe routed per token."""
        if not self.routes_by_weights:
            return None
        if self.mode == "moe":
            from tracerl.composition.accuracy import LabelledPrompt, opening_weights

            tools = tools if tools is not None else [[] for _ in conversations]
            return opening_weights(self, self._tokenizer(), [LabelledPrompt(m, t, "") for m, t in zip(conversations, tools, strict=True)])
        if self.router is None:
            raise RuntimeError("this composition has no task router (load it with load_composed)")
        return self._weights(self.router.alphas(conversations))

    def weights_for_prompt_ids(self, prompts: list[list[int]]) -> torch.Tensor:
        """Routing weights for chat-templated prompts given as token ids; each must contain its whole first user turn."""
        if self.mode == "moe":
            from tracerl.composition.accuracy import opening_weights_for_ids

            return opening_weights_for_ids(self, self._tokenizer(), prompts)
        if self.router is None:
            raise RuntimeError("this composition has no task router (load it with load_composed)")
        texts = []
        for ids in prompts:
            request = first_user_turn(self.router.tokenizer.decode(ids, skip_special_tokens=False))
            if request is None:
                raise RuntimeError("a router/merge composed model routes on each prompt's whole first user turn, "
                                   "which this prompt lacks: pass routing_weights=")
            texts.append(request)
        return self._weights(self.router.label_logits(texts).softmax(dim=-1))

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise RuntimeError("moe routing at the opening renders the opening: set composition.tokenizer (load_composed does)")
        return self.tokenizer

    def _weights(self, alpha: torch.Tensor) -> torch.Tensor:
        return top1_weights(alpha) if self.mode == "router" else top_p_weights(alpha, self.top_p)

    def forward_kwargs(self, extras: list[Any]) -> dict[str, Any]:
        """`generate(composed_model, ..., forward_kwargs=composition.forward_kwargs)` with each request's
        `extra` a tuple of its N+1 routing weights: the running rows' weights as one (rows, N+1) tensor."""
        if not self.routes_by_weights or not extras or any(e is None for e in extras):
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


def adapter_capability(name: str, description: str = "") -> Capability:
    """The capability an adapter serves: its name is the capability's (snake_case) name."""
    try:
        return Capability(name=name, description=description)
    except ValidationError:
        raise InputError(f"adapter name {name!r} is not a snake_case capability name (rename its directory)") from None


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
        capabilities = [adapter_capability(a.name) for a in adapters]
    check_capabilities(capabilities, adapters)
    for p in model.parameters():
        p.requires_grad_(False)
    composition = Composition(model, adapters, capabilities, mode)
    layers = composition.layers
    layer_prefix = {f"model.layers.{i}.": i for i in range(len(layers))}
    targets = sorted({name for a in adapters for name in a.modules})
    for name in targets:
        index = next((i for prefix, i in layer_prefix.items() if name.startswith(prefix)), None)
        if index is None:
            raise InputError(f"adapter target {name} is outside the decoder layers; only layer linears can be routed")
        experts = {slot: a.modules[name] for slot, a in enumerate(adapters, start=1) if name in a.modules}
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = GatedLoRALinear(getattr(parent, child), experts)
        setattr(parent, child, linear)
        composition.linears[index].append(linear)
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
    model.tracerl_composition = composition
    composition.assert_frozen()
    return composition


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
