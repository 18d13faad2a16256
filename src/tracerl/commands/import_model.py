"""`tracerl import-model`: a causal LM of your own (directory, hub id, GGUF) as a base directory for tracerl."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def import_model_command(
    source: Annotated[str, typer.Argument(help="A Hugging Face model directory or hub id, or a .gguf file.")],
    out: Annotated[Path, typer.Option("--out", help="The directory to write (must not exist, or be empty).")],
    chat_template: Annotated[Optional[str], typer.Option(
        "--chat-template", help="The chat template: 'chatml' (ChatML turns, Hermes <tool_call> blocks), 'qwen3', "
        "'tiny-agent', or a Jinja file (default: the model's own, which must render tools).")] = None,
    tool_call_format: Annotated[Optional[str], typer.Option(
        "--tool-call-format", help="The format the model's tool calls are parsed in: hermes, qwen3_xml, llama3_json, "
        "mistral (default: the one the template teaches).")] = None,
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="float32, bfloat16 or float16 (default: as loaded; a GGUF dequantizes to float32).")] = None,
) -> None:
    """Write a model as a plain Hugging Face directory whose chat template renders tool calls: what `model.base`
    names. A GGUF is dequantized once; a template that cannot render tools is refused and nothing is written."""
    from tracerl.models.importing import import_model

    done = import_model(source, out, chat_template=chat_template, tool_call_format=tool_call_format, dtype=dtype)
    typer.echo(f"wrote {done.out}: {done.parameters:,} parameters ({done.dtype}), chat template {done.chat_template}, "
               f"tool calls as {done.tool_call_format}", err=True)


def register(app: typer.Typer) -> None:
    app.command("import-model")(import_model_command)
