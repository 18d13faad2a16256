"""The composed-model directory: what `tracerl compose` writes and `load_composed` reads.

    composed/
      composition.json     `tracerl.contracts.CompositionSpec`: mode, base and adapter references,
                           capabilities in slot order, router settings, gate-training summary,
                           measured routing_accuracy
      gates.safetensors    moe mode: the per-layer gates (`gates.<layer>.weight|bias`)
      router_head.safetensors  router/merge modes with a fitted label head (`weight`, `bias`)

Base and adapters are referenced, not copied: paths are stored relative to the composed
directory (so a workspace can move as a whole), hub ids as given. `composition.json` is written
last and atomically, so a directory without it is incomplete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tracerl.contracts import AdapterRef, CompositionSpec, RouterSettings
from tracerl.core.errors import InputError
from tracerl.models.composed.adapters import load_adapter
from tracerl.models.composed.composition import Composition, compose
from tracerl.models.composed.router import BASE_DESCRIPTION
from tracerl.models.local import load_model

SPEC_FILE = "composition.json"
GATES_FILE = "gates.safetensors"
ROUTER_HEAD_FILE = "router_head.safetensors"


def reference(path_or_id: str, out: Path) -> str:
    """A path relative to `out` when `path_or_id` is an existing path, else the id unchanged."""
    if os.path.exists(path_or_id):
        return os.path.relpath(os.path.realpath(path_or_id), os.path.realpath(out))
    return path_or_id


def resolve(ref: str, out: Path) -> str:
    candidate = out / ref
    return str(candidate) if not os.path.isabs(ref) and candidate.exists() else ref


def spec_for(composition: Composition, base: str, out: Path, **extra: Any) -> CompositionSpec:
    router = composition.router
    router_fit = extra.pop("router_fit", None)
    return CompositionSpec(
        model_name=extra.pop("model_name", None) or Path(out).resolve().name,
        mode=composition.mode,
        base=reference(base, out),
        adapters=[AdapterRef(name=a.name, path=reference(a.path, out)) for a in composition.adapters],
        capabilities=list(composition.capabilities),
        slots=composition.slot_names,
        gate_parameters=composition.gate_parameter_count(),
        moe_routing=composition.moe_routing if composition.mode == "moe" else None,
        router=RouterSettings(labels=router.labels, base_description=router.base_description, top_p=composition.top_p,
                              kind=router.kind, fit=router_fit) if router else None,
        **extra,
    )


def save_composed(composition: Composition, spec: CompositionSpec, out: str | Path) -> None:
    """Write gates (moe) and then composition.json, each atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if composition.gates is not None:
        tensors = {f"gates.{i}.{k}": v.detach().cpu().contiguous() for i, g in enumerate(composition.gates) for k, v in g.state_dict().items()}
        tmp = out / f".{GATES_FILE}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, out / GATES_FILE)
    elif (out / GATES_FILE).exists():
        (out / GATES_FILE).unlink()
    router = composition.router
    if router is not None and router.head_weight is not None:
        tmp = out / f".{ROUTER_HEAD_FILE}.tmp"
        save_file({"weight": router.head_weight.cpu().contiguous(), "bias": router.head_bias.cpu().contiguous()}, str(tmp))
        os.replace(tmp, out / ROUTER_HEAD_FILE)
    elif (out / ROUTER_HEAD_FILE).exists():
        (out / ROUTER_HEAD_FILE).unlink()
    spec.write(out / SPEC_FILE)


def with_adapters(composed: str | Path, adapters: dict[str, str | Path], out: str | Path) -> CompositionSpec:
    """The composition in `composed` over other weights of its adapters (`adapters`: each adapter's name →
    a PEFT directory of the same shapes, e.g. a training snapshot), written to `out`: the same mode,
    capabilities and slots, its gates or router head reused as they are (copied), not trained again.
    `load_composed(out)` loads it (and checks that the adapters fit)."""
    composed, out = Path(composed), Path(out)
    spec = read_spec(composed)
    names = [a.name for a in spec.adapters]
    if sorted(adapters) != sorted(names):
        raise InputError(f"the composition's adapters are {names}, not {sorted(adapters)}", path=str(composed))
    out.mkdir(parents=True, exist_ok=True)
    for name in (GATES_FILE, ROUTER_HEAD_FILE):
        if (composed / name).is_file():
            tmp = out / f".{name}.tmp"
            shutil.copyfile(composed / name, tmp)
            os.replace(tmp, out / name)
        elif (out / name).exists():
            (out / name).unlink()
    new = spec.model_copy(update={
        "base": reference(resolve(spec.base, composed), out),
        "adapters": [AdapterRef(name=a.name, path=reference(str(adapters[a.name]), out)) for a in spec.adapters],
    })
    new.write(out / SPEC_FILE)
    return new


def read_spec(path: str | Path) -> CompositionSpec:
    path = Path(path)
    if not (path / SPEC_FILE).is_file():
        raise InputError(f"not a composed-model directory (no {SPEC_FILE})", path=str(path))
    return CompositionSpec.read(path / SPEC_FILE)


def load_composed(path: str | Path, *, device: str | torch.device | None = None,
                  dtype: str | torch.dtype | None = None) -> Any:
    """Load a composed-model directory: a `ComposedModel` (an HF causal LM that routes every call)
    with `model.tracerl_composition` set.

    The result is used like any causal LM (`forward(input_ids, attention_mask=…,
    past_key_values=…, use_cache=…)` → `.logits`, KV cache, `generate`); `model.tracerl_tokenizer`
    is the base's tokenizer. Router/merge modes take the routing weights of each call,
    `model(…, routing_weights=composition.weights_for(conversations))`; `generate` without them
    routes each row from its prompt. `dtype` None: the precision it was composed in (composition.json's).
    """
    path = Path(path)
    spec = read_spec(path)
    model, tokenizer = load_model(resolve(spec.base, path), device=device, dtype=dtype if dtype is not None else spec.dtype)
    adapters = [load_adapter(resolve(a.path, path), name=a.name) for a in spec.adapters]
    router = spec.router
    composition = compose(model, adapters, list(spec.capabilities), mode=spec.mode, moe_routing=spec.moe_routing or "token",
                          tokenizer=tokenizer, router_labels=router.labels if router else None,
                          router_base_description=router.base_description if router else BASE_DESCRIPTION,
                          template_kwargs=spec.template_kwargs, top_p=router.top_p if router else 0.9,
                          name=spec.model_name)
    if composition.gates is not None:
        gates_path = path / GATES_FILE
        if not gates_path.is_file():
            raise InputError(f"moe composition without {GATES_FILE}", path=str(path))
        state = load_file(str(gates_path))
        for i, gate in enumerate(composition.gates):
            try:
                gate.load_state_dict({k: state[f"gates.{i}.{k}"] for k in ("weight", "bias")})
            except (KeyError, RuntimeError) as e:
                raise InputError(f"gates do not fit the base model ({e})", path=str(gates_path)) from None
    if router is not None and composition.router is not None:
        if router.kind == "label-head":
            head_path = path / ROUTER_HEAD_FILE
            if not head_path.is_file():
                raise InputError(f"router kind label-head without {ROUTER_HEAD_FILE}", path=str(path))
            head = load_file(str(head_path))
            hidden = model.config.hidden_size
            if set(head) != {"weight", "bias"} or tuple(head["weight"].shape) != (composition.num_slots, hidden):
                raise InputError(f"the router head does not fit ({composition.num_slots} labels × hidden {hidden})", path=str(head_path))
            composition.router.set_head(head["weight"], head["bias"])
    model.tracerl_tokenizer = tokenizer
    return composition.composed_model
