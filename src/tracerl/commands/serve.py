"""`tracerl serve`: the OpenAI-compatible server over the local backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from tracerl.core.errors import InputError


def serve_command(
    model: Annotated[str, typer.Option(help="Model directory or hub name; 'tiny-agent' is the embedded agent.")] = "tiny-agent",
    lora: Annotated[Optional[list[str]], typer.Option(help="NAME=PATH of a PEFT LoRA adapter to serve (repeatable).")] = None,
    served_model_name: Annotated[Optional[str], typer.Option(help="The base model's name in requests (default: the model argument).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option(help="Require 'Authorization: Bearer KEY' (default: $TRACERL_API_KEY, else none).")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 … (default: cuda when present).")] = None,
    dtype: Annotated[str, typer.Option(help="auto (the checkpoint's own; a composed model's: its composition's), "
                                            "bfloat16, float16 or float32.")] = "auto",
    max_tokens: Annotated[int, typer.Option(help="Largest max_tokens a request may ask for.")] = 1024,
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body.")] = 1_000_000,
    max_batch_size: Annotated[int, typer.Option(help="Rows batched together in one generation.")] = 16,
    max_queue: Annotated[int, typer.Option(help="Requests waiting beyond which the server answers 503.")] = 256,
    logprobs_mode: Annotated[str, typer.Option(help="raw_logprobs (vLLM's default) or processed_logprobs.")] = "raw_logprobs",
    router: Annotated[Optional[str], typer.Option(help="A router/merge composed directory: route requests for it to --upstream's adapters.")] = None,
    upstream: Annotated[Optional[str], typer.Option(help="With --router: the one-LoRA-per-request server (vLLM) to forward to, e.g. http://host:8000/v1.")] = None,
) -> None:
    """Serve a model (and LoRA adapters by name) over HTTP with the OpenAI API; Ctrl-C stops it."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import serve_forever

    if router is not None or upstream is not None:  # task-level routing proxy (tracerl.composition.proxy)
        if not (router and upstream):
            raise InputError("--router and --upstream go together")
        from tracerl.serve.proxy import serve_router_proxy

        return serve_router_proxy(router, upstream, host=host, port=port, served_model_name=served_model_name, upstream_base_name=None, device=device)
    if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
        raise InputError(f"--logprobs-mode must be raw_logprobs or processed_logprobs, got '{logprobs_mode}'")
    if not 0 < port < 65536:
        raise InputError(f"--port must be in 1…65535, got {port}")
    adapters = []
    for entry in lora or []:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--lora takes NAME=PATH, got '{entry}'")
        if not (Path(path) / "adapter_config.json").exists():
            raise InputError(f"--lora {name}: not a PEFT adapter directory: {path}")
        adapters.append((name, path))
    if (Path(model) / "composition.json").exists():  # a composed model from `tracerl compose`
        from tracerl.models.composed.policy import composed_server_policy

        policy, served_model_name = composed_server_policy(model, device, logprobs_mode, served_model_name, adapters,
                                                           dtype=None if dtype == "auto" else dtype)
    else:
        loaded, tokenizer = load_model(model, device=device, dtype=dtype)
        policy = LocalPolicy(loaded, tokenizer, logprobs_mode=logprobs_mode)  # type: ignore[arg-type]
    for name, path in adapters:
        policy.load_adapter(name, path)
    key = api_key if api_key is not None else os.environ.get("TRACERL_API_KEY") or None
    typer.echo(f"serving {model} as '{served_model_name or model}' on http://{host}:{port}/v1"
               f" (adapters: {', '.join(policy.adapters) or 'none'}; api key {'required' if key else 'not required'})", err=True)
    serve_forever(policy, host=host, port=port, max_batch_size=max_batch_size, max_queue=max_queue,
                  served_model_name=served_model_name or model, api_key=key, max_tokens_limit=max_tokens,
                  max_request_bytes=max_request_bytes)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
