"""Put N LoRA adapters into one Hugging Face causal LM and route between them.

`compose(model, adapters, capabilities, mode=…)` swaps each adapted `nn.Linear` of `model` (in
place) for a `GatedLoRALinear` and returns a `Composition`, also reachable as
`model.tracerl_composition`, complete as constructed (mode, routing, router, tokenizer). No method
of the model is replaced and no hook stays registered: the model itself still computes the base
model, and routing is per call — `composition.composed_model` (what `load_composed` returns) is
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

Routing a call: forward pre-hooks installed for one call and removed after it, as PEFT's
`_enable_peft_forward_hooks` does for `adapter_names`:

- a pre-hook on each decoder layer computes that layer's per-token slot weights (batch, seq, N+1)
  from its input hidden state: moe — the layer's gate picks one slot per token (top-1; slot 0 = no
  adapter), scaled by the gate probability while the gates train (Switch Transformer), so
  gradients reach them; router / merge, and moe routed at the opening — the explicit
  `routing_weights` (batch, N+1), one row per sequence, applied to every token;
- a pre-hook on each of the layer's gated linears passes those weights in (`route=`).

The hooks are removed in a `finally`, so an exception inside the call leaves none behind.
Registering and removing them costs about 9 µs each on CPU (2026-12-01, a loaded 2-core machine):
2.5 ms a call for a Qwen3-8B layout (36 layers × 7 adapted linears + 36 layers).

Routing at the opening (`prompt_slot`): each token of the first user turn onward (the label mask)
routes once per decoder layer; the token's slot is the one most of its layers chose (a tie goes to
the deepest layer's choice among the tied: it has seen the most context), and the prompt's slot is
the one most of its tokens chose (a tie goes to the lower slot). Pooling the layer × token decisions
instead lets the first layer outvote the rest: its gate reads the token embedding alone, so the
same token routes the same way in every task.

Base weights and adapters are frozen; only the gates are parameters that train.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from pydantic import ValidationError
from torch import nn

from tracerl.contracts import COMPOSITION_MODES, MOE_ROUTINGS, Capability
from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.models.chat import first_user_turn
from tracerl.models.composed.adapters import ExpertLoRA, LoRAAdapter, check_adapters, expert_targets
from tracerl.models.composed.examples import (
    GateExample,
    opening_example_from_ids,
    pad_batch,
    prompt_example,
)
from tracerl.models.composed.experts import GatedLoRAExperts
from tracerl.models.composed.layers import GatedLoRALinear, LayerRoute
from tracerl.models.composed.router import BASE_DESCRIPTION, TaskRouter

Mode = Literal["moe", "router", "merge"]
MoeRouting = Literal["token", "opening"]


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

    def __init__(self, model: nn.Module, adapters: list[LoRAAdapter], capabilities: list[Capability], mode: Mode, *,
                 moe_routing: MoeRouting, tokenizer: Any, router: TaskRouter | None, top_p: float,
                 gates: nn.ModuleList | None, name: str | None):
        self.model = model
        self.adapters = adapters
        self.capabilities = capabilities
        self.mode: Mode = mode
        self.moe_routing: MoeRouting = moe_routing  # moe: each token routes itself, or each episode at its opening
        self.tokenizer = tokenizer  # the base's: routing at the opening renders the opening
        self.router = router  # router / merge: the task router
        self.top_p = top_p  # merge: labels kept until their probability reaches it
        self.name = name  # the name the composed model is served under
        self.num_slots = len(adapters) + 1
        self.layers = decoder_layers(model)
        # per decoder layer, the modules its routing reaches: gated linears and gated experts blocks
        self.linears: list[list[GatedLoRALinear | GatedLoRAExperts]] = [[] for _ in self.layers]
        self.gates = gates
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
        """Route the calls of `self.model` inside this block: `routed`."""
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
            tools = tools if tools is not None else [[] for _ in conversations]
            return opening_weights(self, self.tokenizer, [LabelledPrompt(m, t, "") for m, t in zip(conversations, tools, strict=True)])
        return self._weights(self._router().alphas(conversations))

    def weights_for_prompt_ids(self, prompts: list[list[int]]) -> torch.Tensor:
        """Routing weights for chat-templated prompts given as token ids; each must contain its whole first user turn."""
        if self.mode == "moe":
            return opening_weights_for_ids(self, self.tokenizer, prompts)
        router = self._router()
        texts = []
        for ids in prompts:
            request = first_user_turn(router.tokenizer.decode(ids, skip_special_tokens=False))
            if request is None:
                raise RuntimeError("a router/merge composed model routes on each prompt's whole first user turn, "
                                   "which this prompt lacks: pass routing_weights=")
            texts.append(request)
        return self._weights(router.label_logits(texts).softmax(dim=-1))

    def _router(self) -> TaskRouter:
        if self.router is None:
            raise RuntimeError(f"a {self.mode} composition without its task router")
        return self.router

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
    moe_routing: MoeRouting = "token",
    tokenizer: Any = None,
    router_labels: list[str] | None = None,
    router_base_description: str = BASE_DESCRIPTION,
    template_kwargs: dict[str, Any] | None = None,
    top_p: float = 0.9,
    name: str | None = None,
    base_ref: str | None = None,
    gate_init_std: float = 0.0,
    seed: int = 0,
) -> Composition:
    """Install `adapters` into `model` (in place, frozen) and return the composition.

    `capabilities[i]` describes `adapters[i]` (slot i+1); by default each adapter's name. Gates
    (moe mode) start with weights drawn from N(0, gate_init_std²) under `seed` and zero bias; the
    default 0 makes every token choose slot 0, i.e. the untrained composition is the base model.
    `tokenizer` (the base's) is needed by the modes that read the opening: router, merge (the task
    router, with `router_labels`, `router_base_description`, `template_kwargs`) and moe routed at the
    opening.
    """
    if mode not in COMPOSITION_MODES:
        raise InputError(f"mode must be one of {', '.join(COMPOSITION_MODES)}, got {mode!r}")
    if moe_routing not in MOE_ROUTINGS:
        raise InputError(f"moe routing must be one of {', '.join(MOE_ROUTINGS)}, got {moe_routing!r}")
    if tokenizer is None and (mode != "moe" or moe_routing == "opening"):
        raise InputError(f"a {mode} composition{' routed at the opening' if mode == 'moe' else ''} reads each "
                         "episode's opening: give the base's tokenizer")
    if getattr(model, "tracerl_composition", None) is not None:
        raise InputError("the model is already composed")
    check_adapters(model, adapters, base_ref)
    if capabilities is None:
        capabilities = [adapter_capability(a.name) for a in adapters]
    check_capabilities(capabilities, adapters)
    for p in model.parameters():
        p.requires_grad_(False)
    layers = decoder_layers(model)
    gates = None
    if mode == "moe":
        hidden = model.config.hidden_size
        param = next(model.parameters())
        generator = torch.Generator().manual_seed(seed)
        gates = nn.ModuleList()
        for _ in layers:
            gate = nn.Linear(hidden, len(adapters) + 1)
            with torch.no_grad():
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * gate_init_std)
                gate.bias.zero_()
            gates.append(gate.to(param.device))
        gates.train(model.training)
        model.tracerl_gates = gates  # a registered submodule: moves with model.to(...)
    router = None if mode == "moe" else TaskRouter(model, tokenizer, capabilities, labels=router_labels,
                                                   base_description=router_base_description,
                                                   template_kwargs=template_kwargs)
    composition = Composition(model, adapters, capabilities, mode, moe_routing=moe_routing if mode == "moe" else "token",
                              tokenizer=tokenizer, router=router, top_p=top_p, gates=gates, name=name)
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
    blocks: dict[str, dict[str, dict[int, ExpertLoRA]]] = {}  # experts block → weight → slot → factors
    for slot, adapter in enumerate(adapters, start=1):
        for name, lora in expert_targets(model, adapter).items():
            block, _, weight = name.rpartition(".")
            blocks.setdefault(block, {}).setdefault(weight, {})[slot] = lora
    for block, by_weight in sorted(blocks.items()):
        index = next((i for prefix, i in layer_prefix.items() if block.startswith(prefix)), None)
        if index is None:
            raise InputError(f"adapter target {block} is outside the decoder layers; only layer experts can be routed")
        parent_name, _, child = block.rpartition(".")
        parent = model.get_submodule(parent_name)
        gated = GatedLoRAExperts(getattr(parent, child), by_weight)
        setattr(parent, child, gated)
        composition.linears[index].append(gated)
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


# --- per-call routing ----------------------------------------------------------------------------


@dataclass
class RoutedCall:
    """What a routed call used and decided. `slots[i]`: moe, the slot of every token at layer i
    (batch, seq); `gate_logits`: with `record=True`, each layer's gate logits in call order."""

    weights: torch.Tensor | None = None
    force_slots: int | torch.Tensor | None = None
    labelled: torch.Tensor | None = None
    repeat_rows: bool = False
    slots: list[torch.Tensor] = field(default_factory=list)
    gate_logits: list[torch.Tensor] | None = None


def rms_normalised(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """h / RMS(h) per token, without parameters: the gates see the residual stream at unit scale,
    whatever a model's residual norms (0.3 in the embedded agent, hundreds in large models)."""
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + eps)


def gate_weights(gate: nn.Linear, hidden: torch.Tensor, call: RoutedCall, index: int) -> torch.Tensor:
    """moe: the one-hot slot of each token (batch, seq, N+1) at layer `index`, as `hidden`'s dtype."""
    logits = gate(rms_normalised(hidden.to(gate.weight.dtype)))
    if call.gate_logits is not None:
        call.gate_logits.append(logits)
    if call.force_slots is None:
        slots = logits.argmax(dim=-1)
    elif isinstance(call.force_slots, int):
        slots = torch.full(logits.shape[:-1], call.force_slots, dtype=torch.long, device=logits.device)
    else:
        slots = call.force_slots.to(logits.device)
    call.slots[index] = slots.detach()
    one_hot = torch.nn.functional.one_hot(slots, logits.shape[-1]).to(logits.dtype)
    if gate.training:  # Switch: scale the chosen expert by its probability so the gate gets gradients
        scale = logits.softmax(dim=-1).gather(-1, slots.unsqueeze(-1))
        if call.labelled is not None:  # the label loss alone trains these tokens' gates
            scale = torch.where(call.labelled.to(scale.device).unsqueeze(-1), scale.detach(), scale)
        one_hot = one_hot * scale
    return one_hot.to(hidden.dtype)


def task_weights(weights: torch.Tensor, hidden: torch.Tensor, repeat_rows: bool) -> torch.Tensor:
    """router / merge: each sequence's row of `weights` on every one of its tokens, (batch, seq, N+1)."""
    batch, seq = hidden.shape[:2]
    if weights.shape[0] != batch:
        if not (repeat_rows and batch % weights.shape[0] == 0):
            raise RuntimeError(f"routing_weights hold {weights.shape[0]} rows but the batch has {batch}")
        weights = weights.repeat_interleave(batch // weights.shape[0], dim=0)  # generate's beams / return sequences
    weights = weights.to(device=hidden.device, dtype=hidden.dtype)
    return weights[:, None, :].expand(batch, seq, weights.shape[-1])


def _route_layer(module: nn.Module, args: tuple, kwargs: dict, *, composition: Composition, call: RoutedCall,
                 index: int, route: LayerRoute) -> None:
    hidden = args[0] if args else kwargs["hidden_states"]
    if call.weights is not None:
        route.weights = task_weights(call.weights, hidden, call.repeat_rows)
    else:
        assert composition.gates is not None
        route.weights = gate_weights(composition.gates[index], hidden, call, index)


def _pass_route(module: nn.Module, args: tuple, kwargs: dict, *, route: LayerRoute) -> tuple[tuple, dict]:
    kwargs["route"] = route
    return args, kwargs


@contextmanager
def routed(composition: Composition, routing_weights: torch.Tensor | None = None, *,
           force_slots: int | torch.Tensor | None = None, record: bool = False, repeat_rows: bool = False,
           labelled: torch.Tensor | None = None) -> Iterator[RoutedCall]:
    """Route the composed model's calls inside this block (see the module docstring).

    moe: the gates route, `force_slots` (a slot, or (batch, seq) slots) overrides them, `record`
    keeps their logits; a moe composition routed at the opening takes `routing_weights` (each
    episode's slot, `Composition.weights_for`) and without them its gates route each token (how
    that slot is decided). router / merge: `routing_weights` (batch, N+1) is required; with
    `repeat_rows`, a batch that is k times as long uses each row for k consecutive sequences.
    """
    if routing_weights is None:
        if composition.mode != "moe":
            raise InputError(f"a {composition.mode} composition routes by explicit routing_weights (batch, "
                             f"{composition.num_slots}): composition.weights_for(conversations), or use ComposedPolicy")
    else:
        if composition.mode == "moe" and composition.moe_routing != "opening":
            raise InputError("a moe composition routed per token takes no routing_weights (they are for router/merge, "
                             "or moe routed at the opening)")
        if routing_weights.dim() != 2 or routing_weights.shape[1] != composition.num_slots:
            raise InputError(f"routing_weights must be (batch, {composition.num_slots}), got {tuple(routing_weights.shape)}")
        if force_slots is not None or record:
            raise InputError("force_slots and record act on the gates: they are for moe calls without routing_weights")
    layers = composition.layers
    if torch.is_grad_enabled() and any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        raise InputError("routing hooks are per call: a checkpointed layer recomputed in backward would run unrouted")
    call = RoutedCall(weights=routing_weights, force_slots=force_slots, repeat_rows=repeat_rows, labelled=labelled,
                      slots=[torch.empty(0)] * len(layers), gate_logits=[] if record else None)
    handles = []
    try:
        for index, layer in enumerate(layers):
            route = LayerRoute()
            hook = partial(_route_layer, composition=composition, call=call, index=index, route=route)
            handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
            for linear in composition.linears[index]:
                handles.append(linear.register_forward_pre_hook(partial(_pass_route, route=route), with_kwargs=True))
        yield call
    finally:
        for handle in handles:
            handle.remove()


class ComposedModel(nn.Module):
    """A composed HF causal LM whose every `forward` / `generate` call is routed (like PEFT's PeftModel).

    `forward(..., routing_weights=None, **hf_kwargs)` and `generate(...)` run the wrapped model
    inside `routed`; any other attribute is the wrapped model's (`config`, `model.layers`, …).
    Router/merge (and moe routed at the opening) `generate` without `routing_weights` routes each
    row from its prompt's first user turn (`Composition.weights_for_prompt_ids`).
    """

    def __init__(self, model: nn.Module, composition: Composition):
        super().__init__()
        self.base_model = model
        self.composition = composition

    def get_base_model(self) -> nn.Module:
        return self.base_model

    def forward(self, *args: Any, routing_weights: torch.Tensor | None = None, **kwargs: Any) -> Any:
        with routed(self.composition, routing_weights):
            return self.base_model(*args, **kwargs)

    def generate(self, input_ids: torch.Tensor | None = None, *args: Any, routing_weights: torch.Tensor | None = None,
                 **kwargs: Any) -> Any:
        if routing_weights is None and self.composition.routes_by_weights and input_ids is not None:
            mask = kwargs.get("attention_mask")
            prompts = [(row if mask is None else row[mask[i].bool()]).tolist() for i, row in enumerate(input_ids)]
            routing_weights = self.composition.weights_for_prompt_ids(prompts).to(input_ids.device)
        with routed(self.composition, routing_weights, repeat_rows=True):
            return self.base_model.generate(input_ids, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_model":  # not yet set (during __init__ or unpickling): no recursion
                raise
            return getattr(self.base_model, name)


# --- routing at the opening ---------------------------------------------------------------------


@dataclass
class LabelledPrompt:
    messages: list[Message]
    tools: list[ToolSchema]
    capability: str


def predicted_slots(composition: Composition, tokenizer, prompts: list[LabelledPrompt], batch_size: int = 16) -> list[int]:
    """The slot each prompt is routed to (see the module docstring)."""
    if composition.mode == "moe":
        return [prompt_slot(v) for v in gate_votes(composition, tokenizer, prompts, batch_size)]
    predictions: list[int] = []
    for start in range(0, len(prompts), batch_size):
        with torch.no_grad():
            alpha = composition.router.alphas([p.messages for p in prompts[start : start + batch_size]])
        predictions.extend(int(s) for s in alpha.argmax(dim=-1))
    return predictions


def gate_votes(composition: Composition, tokenizer, prompts: list[LabelledPrompt], batch_size: int = 16) -> list[torch.Tensor]:
    """moe: each prompt's routing decisions, (layers, tokens) slots over its label-masked tokens."""
    return example_votes(composition, [prompt_example(tokenizer, p.messages, p.tools, 0) for p in prompts], batch_size)


def opening_weights(composition: Composition, tokenizer, prompts: list[LabelledPrompt]) -> torch.Tensor:
    """moe routed at the opening: one-hot (batch, N+1) on each prompt's `prompt_slot`."""
    return _one_hot(composition, gate_votes(composition, tokenizer, prompts))


def opening_weights_for_ids(composition: Composition, tokenizer, prompts: list[list[int]]) -> torch.Tensor:
    """`opening_weights` of ChatML-rendered prompts given as token ids."""
    return _one_hot(composition, example_votes(composition, [opening_example_from_ids(tokenizer, ids) for ids in prompts]))


def _one_hot(composition: Composition, votes: list[torch.Tensor]) -> torch.Tensor:
    slots = torch.tensor([prompt_slot(v) for v in votes], dtype=torch.long)
    return torch.nn.functional.one_hot(slots, composition.num_slots).to(torch.float32)


@torch.no_grad()
def example_votes(composition: Composition, examples: list[GateExample], batch_size: int = 16) -> list[torch.Tensor]:
    """moe: the gates' per-token decisions on each example, (layers, tokens) slots over its label mask."""
    model = composition.model
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = pad_batch(chunk)
        was_training = model.training
        model.eval()
        try:
            with composition.routing() as call:
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device), use_cache=False)
        finally:
            model.train(was_training)
        votes = torch.stack(call.slots).cpu()  # (layers, batch, seq)
        mask = batch["label_mask"].bool() & batch["attention_mask"].bool()
        out.extend(votes[:, row][:, mask[row]] for row in range(len(chunk)))
    return out


def prompt_slot(votes: torch.Tensor) -> int:
    """Per-token majority over `votes` (layers, tokens) of slots; 0 when there are no tokens."""
    token_slots = []
    for column in votes.T.tolist():  # one token's choices, first layer to last
        counts = Counter(column)
        top = max(counts.values())
        token_slots.append(next(s for s in reversed(column) if counts[s] == top))
    counts = Counter(token_slots)
    return min(counts, key=lambda s: (-counts[s], s)) if counts else 0
