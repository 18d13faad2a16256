"""Read PEFT LoRA adapter directories as plain tensors and check them against one base model.

An adapter directory is what `PeftModel.save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors`, whose keys look like
`base_model.model.<module path>.lora_A.weight` (r × in) and `….lora_B.weight` (out × r).
The LoRA update of a module is `scaling · B A` with `scaling = lora_alpha / r`
(`lora_alpha / √r` with `use_rslora`), exactly as PEFT computes it.

A mixture-of-experts base's fused expert weights (PEFT's `target_parameters`) are saved per experts
block, one wrapper per weight (`….experts[.base_layer…].lora_A.weight`, (r·experts) × in, and
`lora_B.weight`, out × (r·experts)); the keys do not name the weight, so `expert_targets` matches each
wrapper to the block's parameter of its shape, [experts, out, in].

Every problem is an `InputError` naming the adapter directory: adapters trained on different
bases, ranks or shapes that do not fit the base, targets the base lacks, LoRA variants the
composition does not implement (DoRA, rank/alpha patterns, trained biases, modules_to_save).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from tracerl.core.errors import InputError
from tracerl.core.io import read_json
from tracerl.models.local import resolve_model_path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."


@dataclass
class LoRAModule:
    """The LoRA factors of one linear layer: update = scaling · B @ A."""

    A: torch.Tensor  # (r, in_features)
    B: torch.Tensor  # (out_features, r)
    scaling: float

    def delta_weight(self) -> torch.Tensor:
        return self.scaling * (self.B @ self.A)


@dataclass
class ExpertLoRA:
    """The LoRA factors of one fused expert weight [experts, out, in]: expert e's update is scaling · B[e] @ A[e]."""

    A: torch.Tensor  # (experts, r, in)
    B: torch.Tensor  # (experts, out, r)
    scaling: float

    def delta_weight(self) -> torch.Tensor:
        return self.scaling * (self.B @ self.A)


@dataclass
class LoRAAdapter:
    """One PEFT LoRA adapter directory, read into tensors keyed by the base model's module path."""

    name: str
    path: str
    base_model_name_or_path: str | None
    base_model_class: str | None
    r: int
    lora_alpha: float
    target_modules: list[str]
    modules: dict[str, LoRAModule] = field(default_factory=dict)
    # fused expert weights: the wrapper's module path (with its `.base_layer`s) → its factors, each
    # expert's (`expert_targets` names the weight)
    expert_wrappers: dict[str, ExpertLoRA] = field(default_factory=dict)
    target_parameters: list[str] = field(default_factory=list)


def _unsupported(config: dict) -> str | None:
    checks = [
        (config.get("peft_type", "LORA") != "LORA", f"peft_type is {config.get('peft_type')!r}, not LORA"),
        (bool(config.get("use_dora")), "DoRA adapters (use_dora) are not supported"),
        (config.get("bias", "none") != "none", f"trained biases (bias={config.get('bias')!r}) are not supported"),
        (bool(config.get("lora_bias")), "lora_bias is not supported"),
        (bool(config.get("modules_to_save")), "modules_to_save is not supported"),
        (bool(config.get("rank_pattern")), "rank_pattern is not supported (one rank per adapter)"),
        (bool(config.get("alpha_pattern")), "alpha_pattern is not supported (one lora_alpha per adapter)"),
        (bool(config.get("fan_in_fan_out")), "fan_in_fan_out adapters are not supported"),
        (bool(config.get("trainable_token_indices")), "trainable_token_indices is not supported"),
        (bool(config.get("layer_replication")), "layer_replication is not supported"),
    ]
    return next((why for bad, why in checks if bad), None)


def load_adapter(path: str | Path, name: str | None = None) -> LoRAAdapter:
    """Read one PEFT LoRA directory; `name` defaults to the directory's name."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("adapter directory not found", path=str(path))
    config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_path.is_file():
        raise InputError(f"not a PEFT adapter directory (no {CONFIG_FILE})", path=str(path))
    if not weights_path.is_file():
        raise InputError(f"no {WEIGHTS_FILE} (save the adapter with safetensors)", path=str(path))
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise InputError("expected a JSON object", path=str(config_path))
    if (why := _unsupported(config)) is not None:
        raise InputError(why, path=str(config_path))
    r = config.get("r")
    if not isinstance(r, int) or r <= 0:
        raise InputError(f"'r' must be a positive integer, got {r!r}", path=str(config_path))
    alpha = float(config.get("lora_alpha", r))
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    try:
        state = load_file(str(weights_path))
    except Exception as e:  # safetensors raises several error types for damaged files
        raise InputError(f"cannot read the weights ({e})", path=str(weights_path)) from None
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        module, kind = _parse_key(key, weights_path)
        factors.setdefault(module, {})[kind] = tensor
    target_parameters = [str(t) for t in config.get("target_parameters") or []]
    expert_blocks = {t.rpartition(".")[0] for t in target_parameters}
    modules, wrappers = {}, {}
    for module, pair in sorted(factors.items()):
        if set(pair) != {"A", "B"}:
            raise InputError(f"module {module} has lora_{''.join(pair)} but not both A and B", path=str(weights_path))
        A, B = pair["A"], pair["B"]
        stripped = module.replace(".base_layer", "")
        if any(stripped == b or stripped.endswith("." + b) for b in expert_blocks):
            if A.dim() != 2 or B.dim() != 2 or A.shape[0] % r or A.shape[0] != B.shape[1]:
                raise InputError(f"expert weights of {module}: lora_A {tuple(A.shape)} / lora_B {tuple(B.shape)} are "
                                 f"not r={r} per expert", path=str(weights_path))
            experts = A.shape[0] // r  # PEFT's layout: A (r·E, in) → (E, r, in); B (out, r·E) → (E, out, r)
            wrappers[module] = ExpertLoRA(A=A.float().reshape(experts, r, A.shape[1]),
                                          B=B.float().reshape(B.shape[0], r, experts).permute(2, 0, 1).contiguous(),
                                          scaling=scaling)
            continue
        if A.dim() != 2 or B.dim() != 2 or A.shape[0] != r or B.shape[1] != r:
            raise InputError(
                f"module {module}: lora_A {tuple(A.shape)} / lora_B {tuple(B.shape)} do not have rank r={r}",
                path=str(weights_path),
            )
        modules[module] = LoRAModule(A=A.float(), B=B.float(), scaling=scaling)
    if not modules and not wrappers:
        raise InputError("the adapter holds no LoRA weights", path=str(weights_path))
    targets = config.get("target_modules") or []
    auto = config.get("auto_mapping") or {}
    return LoRAAdapter(
        name=name or path.resolve().name,
        path=str(path),
        base_model_name_or_path=config.get("base_model_name_or_path") or None,
        base_model_class=auto.get("base_model_class"),
        r=r,
        lora_alpha=alpha,
        target_modules=sorted(targets) if isinstance(targets, list) else [str(targets)],
        modules=modules,
        expert_wrappers=wrappers,
        target_parameters=target_parameters,
    )


def expert_targets(model: nn.Module, adapter: LoRAAdapter) -> dict[str, ExpertLoRA]:
    """The adapter's fused-expert factors keyed by the weight they adapt ("model.layers.0.mlp.experts.down_proj"):
    each wrapper matched to the parameter of its experts block whose shape [experts, out, in] it fits."""
    out: dict[str, ExpertLoRA] = {}
    for wrapper, lora in adapter.expert_wrappers.items():
        block_path = wrapper.replace(".base_layer", "")
        try:
            block = model.get_submodule(block_path)
        except AttributeError:
            raise InputError(f"adapter {adapter.name} adapts experts at {block_path}, which the base model lacks",
                             path=adapter.path) from None
        if not is_fused_experts(block):
            raise InputError(f"adapter {adapter.name}: {block_path} is not a fused experts block this composition "
                             "supports (Qwen3-MoE's gate_up_proj and down_proj)", path=adapter.path)
        shape = (lora.A.shape[0], lora.B.shape[1], lora.A.shape[2])
        names = [n for n in ("gate_up_proj", "down_proj") if tuple(getattr(block, n).shape) == shape]
        if len(names) != 1 or f"{block_path}.{names[0]}" in out:
            raise InputError(f"adapter {adapter.name}: expert factors of shape {shape} at {wrapper} fit no single "
                             "weight of the base's experts (a different base?)", path=adapter.path)
        out[f"{block_path}.{names[0]}"] = lora
    return out


def _parse_key(key: str, weights_path: Path) -> tuple[str, str]:
    for suffix, kind in ((".lora_A.weight", "A"), (".lora_B.weight", "B")):
        if key.startswith(KEY_PREFIX) and key.endswith(suffix):
            return key[len(KEY_PREFIX) : -len(suffix)], kind
    raise InputError(f"unexpected tensor {key!r} (only LoRA A/B weights of linear layers are supported)", path=str(weights_path))


def same_base(a: str | None, b: str | None) -> bool:
    """Whether two `base_model_name_or_path` values name the same model (unknown matches anything)."""
    if not a or not b:
        return True
    return _normalise(a) == _normalise(b)


def _normalise(ref: str) -> str:
    ref = resolve_model_path(ref)
    return os.path.realpath(ref) if os.path.exists(ref) else ref.rstrip("/")


def check_adapters(model: nn.Module, adapters: list[LoRAAdapter], base_ref: str | None = None) -> None:
    """Raise InputError unless every adapter was trained on `model` (named `base_ref`) and fits it."""
    if not adapters:
        raise InputError("no adapters given")
    names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise InputError(f"adapter names must be distinct, got {names}")
    first = adapters[0]
    for adapter in adapters:
        if not same_base(adapter.base_model_name_or_path, first.base_model_name_or_path):
            raise InputError(
                f"adapters of different bases: {first.name} was trained on {first.base_model_name_or_path!r}, "
                f"{adapter.name} on {adapter.base_model_name_or_path!r}",
                path=adapter.path,
            )
        if not same_base(adapter.base_model_name_or_path, base_ref):
            raise InputError(
                f"adapter {adapter.name} was trained on {adapter.base_model_name_or_path!r}, not on the base {base_ref!r}",
                path=adapter.path,
            )
        cls = type(model).__name__
        if adapter.base_model_class and adapter.base_model_class != cls:
            raise InputError(f"adapter {adapter.name} was trained on a {adapter.base_model_class}, the base is a {cls}", path=adapter.path)
        expert_targets(model, adapter)  # each wrapper fits one fused weight of the base
        linears = dict(model.named_modules())
        for module_name, lora in adapter.modules.items():
            target = linears.get(module_name)
            if target is None:
                raise InputError(f"adapter {adapter.name} targets {module_name}, which the base model lacks", path=adapter.path)
            if not isinstance(target, nn.Linear):
                raise InputError(f"adapter {adapter.name} targets {module_name}, which is not a linear layer", path=adapter.path)
            if lora.A.shape[1] != target.in_features or lora.B.shape[0] != target.out_features:
                raise InputError(
                    f"adapter {adapter.name}, module {module_name}: LoRA maps {lora.A.shape[1]} → {lora.B.shape[0]} "
                    f"but the base layer maps {target.in_features} → {target.out_features} (a different base?)",
                    path=adapter.path,
                )


def is_fused_experts(module: nn.Module) -> bool:
    """Whether `module` is a fused experts block this composes: Qwen3-MoE's layout (concatenated gate and up,
    not transposed, gated), `gate_up_proj` and `down_proj` parameters."""
    return (type(module).__name__.endswith("Experts") and not getattr(module, "is_transposed", False)
            and getattr(module, "is_concatenated", True) and getattr(module, "has_gate", True)
            and not getattr(module, "has_bias", False)
            and all(isinstance(getattr(module, n, None), nn.Parameter) for n in ("gate_up_proj", "down_proj")))
