"""Check a PEFT LoRA adapter folder against the model it is to be loaded into, before anything loads.

`check_adapter(model, path)` reads adapter_config.json and the tensor shapes of
adapter_model.safetensors (no tensor is loaded) and refuses, with one `InputError` naming the folder:
a folder without them, a config that is not a LoRA's, weights that cannot be read (a truncated or
corrupt file), and an adapter of another base — one that adapts a module the model does not have,
or whose factors do not match the module's in/out features (the fused expert weights of a
mixture-of-experts block, PEFT's target_parameters, are left to PEFT). Only safetensors weights are accepted
(PEFT's .bin fallback is a pickle).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from safetensors import safe_open

from tracerl.contracts import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from tracerl.core.errors import InputError
from tracerl.core.io import read_json

_FACTOR = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_A|lora_B)(?:\.[^.]+)?\.weight$")


def adapter_shapes(path: str | Path) -> dict[str, list[int]]:
    """The tensor names and shapes of an adapter folder's weights, checked to be a readable LoRA."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("not an adapter folder", path=str(path))
    if not (path / ADAPTER_CONFIG).is_file():
        raise InputError(f"not a PEFT adapter folder (no {ADAPTER_CONFIG})", path=str(path))
    config = read_json(path / ADAPTER_CONFIG)
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise InputError("not a LoRA adapter (peft_type is not LORA)", path=str(path / ADAPTER_CONFIG))
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise InputError(f"no {ADAPTER_WEIGHTS} (adapters are read from safetensors only)", path=str(path))
    try:
        with safe_open(str(weights), "pt") as f:
            shapes = {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as e:  # noqa: BLE001 — safetensors raises several types for a damaged file
        raise InputError(f"cannot read the weights ({type(e).__name__}: {str(e)[:200]})", path=str(weights)) from None
    if not any(_FACTOR.match(k) for k in shapes):
        raise InputError("the weights hold no LoRA factors (lora_A / lora_B)", path=str(weights))
    return shapes


def check_adapter(model: Any, path: str | Path) -> None:
    """Refuse (one `InputError`) an adapter folder that is damaged or made for another base model."""
    shapes = adapter_shapes(path)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    modules = dict(base.named_modules())
    for key, shape in sorted(shapes.items()):
        match = _FACTOR.match(key)
        if match is None:
            continue
        name, part = match["module"], match["part"]
        module = modules.get(name)
        if module is None and ".base_layer" in name:  # PEFT nests the wrappers of an experts block's fused weights
            module = modules.get(name.replace(".base_layer", ""))
        if module is None:
            raise InputError(f"does not fit the base model: it adapts '{name}', which the base model does not have",
                             path=str(path))
        layer = module.get_base_layer() if hasattr(module, "get_base_layer") else module
        if any(p.dim() == 3 for p in layer.parameters(recurse=False)):
            continue  # fused expert weights (target_parameters): PEFT checks their shapes as it loads
        features = getattr(layer, "in_features", None), getattr(layer, "out_features", None)
        if None in features or len(shape) != 2:
            continue  # not a linear layer: PEFT checks the rest as it loads
        expected = features[0] if part == "lora_A" else features[1]
        got = shape[1] if part == "lora_A" else shape[0]
        if got != expected:
            raise InputError(f"does not fit the base model: '{name}' maps {features[0]} → {features[1]} features, "
                             f"the adapter's {part} has shape {shape}", path=str(path))
