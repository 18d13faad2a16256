"""A model of your own as a base for tracerl: any causal LM — a Hugging Face directory or hub id, or a GGUF
file — written once as a plain Hugging Face directory whose chat template renders tools.

    tracerl import-model SmolLM2-135M-Instruct.Q4_1.gguf --chat-template chatml --out models/smollm2
    # model.base: models/smollm2   (collect, train, compose, serve, vLLM: everything reads a plain directory)

Why a directory: every stage loads the base by its path (adapters record it as their base, a composed model
refers to it, `tracerl serve` and vLLM load it), so the template must travel with the weights; and a model
loaded from a GGUF keeps transformers' GGUF quantizer, which refuses `save_pretrained`. The weights are
dequantized once here and saved as safetensors (float32 unless `dtype` says otherwise); the tokenizer is
saved with the chat template, and `tool_call_format` (when given) in its tokenizer_config.json, where
`tracerl.models.chat.ChatFormat` reads it.

The template is one of `CHAT_TEMPLATES` by name (`chatml`: ChatML turns with Hermes `<tool_call>` blocks,
Qwen2.5's format, for a ChatML model such as SmolLM2), a Jinja file, or none (keep the model's own). It must
render a tool-calling conversation (`ChatFormat.tool_rendering_problem`); a model whose template does not is
refused with what is missing, and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tracerl.core.errors import InputError
from tracerl.models.chat import ChatFormat
from tracerl.models.local import load_model
from tracerl.models.parsing import TOOL_CALL_FORMATS
from tracerl.models.templates import CHAT_TEMPLATES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TEMPLATE_ADVICE = (f"give the model a template that does: tracerl import-model MODEL --chat-template "
                   f"{'|'.join(CHAT_TEMPLATES)}|FILE.jinja --out DIR")
GGUF_BASE = ("a GGUF file cannot be a base to train on (adapters and composed models refer to their base by path, and a "
             "GGUF-loaded model cannot be saved); convert it once: tracerl import-model FILE.gguf --out DIR "
             "[--chat-template chatml], then use DIR")


@dataclass(frozen=True)
class ImportedModel:
    out: Path
    parameters: int
    dtype: str
    chat_template: str  # the built-in name, the file, or "the model's own"
    tool_call_format: str


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def chat_template_text(spec: str) -> str:
    """A built-in template's text (`CHAT_TEMPLATES`) or a Jinja file's."""
    if spec in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[spec]
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"--chat-template: neither a built-in template ({', '.join(CHAT_TEMPLATES)}) nor a file: {spec}")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=spec) from None


def import_model(source: str, out: str | Path, *, chat_template: str | None = None, tool_call_format: str | None = None,
                 dtype: str | None = None) -> ImportedModel:
    """Write `source` (directory, hub id or .gguf) to `out` as a Hugging Face directory with `chat_template`.

    `out` must not exist or be empty; it appears whole or not at all (written under a temporary name, then
    renamed)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out: {out} exists and is not an empty directory")
    if tool_call_format is not None and tool_call_format not in TOOL_CALL_FORMATS:
        raise InputError(f"--tool-call-format: unknown format '{tool_call_format}' (known: {', '.join(TOOL_CALL_FORMATS)})")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype: unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
    template = chat_template_text(chat_template) if chat_template is not None else None
    model, tokenizer = load_model(source, device="cpu", dtype=DTYPES[dtype] if dtype else None)
    if template is not None:
        tokenizer.chat_template = template
    try:
        chat = ChatFormat(tokenizer, tool_format=tool_call_format)
    except (ValueError, KeyError) as e:
        raise InputError(f"{source}: {e}") from None
    problem = chat.tool_rendering_problem()
    if problem is not None:
        given = f"the template {chat_template}" if chat_template else "its own template"
        raise InputError(f"{source} with {given}: {problem}; give one that does with --chat-template "
                         f"(built-in: {', '.join(CHAT_TEMPLATES)}; or a Jinja file)")
    if str(source).endswith(".gguf"):
        # A GGUF-loaded model keeps transformers' GGUF quantizer (and its config), which refuses to save. With no
        # GGUF matmul kernel (the `kernels` package) its weights were dequantized as loaded and are saved as a
        # plain model's; weights kept in GGUF blocks (uint8) cannot be.
        if any(not p.is_floating_point() for p in model.parameters()):
            raise InputError(f"{source}: transformers kept the GGUF's weights packed (the package 'kernels' is "
                             "installed); import it where it is not")
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if tool_call_format is not None:
            config_path = tmp / "tokenizer_config.json"
            config = json.loads(config_path.read_text())
            config_path.write_text(json.dumps({**config, "tool_call_format": tool_call_format}, indent=2) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give the directory the usual permissions
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    first = next(model.parameters())
    return ImportedModel(out=out, parameters=sum(p.numel() for p in model.parameters()), dtype=str(first.dtype).removeprefix("torch."),
                         chat_template=chat_template or "the model's own", tool_call_format=chat.tool_format)
