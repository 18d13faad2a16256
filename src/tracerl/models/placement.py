"""Precision and placement of an in-process model: the names a config uses, resolved to torch's.

    dtype   "auto" (the checkpoint's own: config.json's `dtype`, as transformers' `dtype="auto"`;
            float32 for the embedded agent, bfloat16 for Qwen3), "bfloat16", "float16", "float32"
    device  "auto" (the first visible GPU when CUDA is available, else the CPU), "cpu", "cuda",
            "cuda:N"

A model loaded with `load_model(path, device=…, dtype=…)` takes both names; `dtype_name(model)` is
the precision it was loaded in (what the stages record beside their outputs). LoRA weights follow
PEFT: an adapter on a bfloat16 or float16 base is kept in float32 and its update added in the
base's precision.
"""

from __future__ import annotations

from typing import Literal

import torch

from tracerl.core.errors import InputError

DType = Literal["auto", "bfloat16", "float16", "float32"]
DTYPES: tuple[str, ...] = ("auto", "bfloat16", "float16", "float32")


def torch_dtype(name: str | torch.dtype | None) -> torch.dtype | str:
    """The `dtype=` argument of `from_pretrained` for a config name: a torch dtype, or "auto" (None too)."""
    if name is None or name == "auto":
        return "auto"
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r} (one of {', '.join(DTYPES)})")
    return getattr(torch, name)


def dtype_name(model: torch.nn.Module) -> str:
    """The precision of a loaded model's weights, as a config names it ("float32", "bfloat16", …):
    the dtype of its first floating-point parameter (a PEFT adapter's float32 factors do not count)."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and "lora_" not in name:
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """The device a config name means: "auto" (or None) is the first visible GPU when CUDA is available,
    else the CPU; a GPU asked for where there is none is an `InputError`."""
    if isinstance(spec, torch.device):
        return spec
    if spec is None or spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {spec!r} (auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {spec!r}: CUDA is not available on this machine")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InputError(f"device {spec!r}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise InputError(f"unknown device {spec!r} (auto, cpu, cuda or cuda:N)")
    return device
