"""Task-level routing in front of a one-LoRA-per-request server (vLLM, or `tracerl serve`).

    tracerl serve --router composed/ --upstream http://gpu-box:8000/v1 [--port 8001]

The upstream serves the base model and the capability adapters by name (`vllm serve BASE
--enable-lora --lora-modules precondition_verification=adapters/precondition_verification …`).
A chat completion asking for the composed model's name is routed by the composition's task
router (run here, on the base model of the composed directory: the zero-shot label
probabilities, or the fitted label head) and forwarded with `model` set to the chosen adapter's
name, or to the upstream's base model when the router picks "base". Every other request is
forwarded unchanged. The route is reported in the `x-tracerl-route` response header.
Only top-1 routing is possible upstream (a server holds one LoRA per request); merge
compositions route to their top adapter too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.models.composed.artifact import load_composed
from tracerl.models.composed.composition import Composition
from tracerl.models.composed.router import route_names


def create_router_proxy(
    composition: Composition,
    upstream: str,
    *,
    served_model_name: str,
    upstream_base_name: str,
    adapter_names: dict[str, str] | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
) -> FastAPI:
    """The proxy app. `adapter_names` maps capability → upstream LoRA name (default: the same name)."""
    if composition.router is None:
        raise ValueError("the composition has no task router")
    app = FastAPI(title="tracerl router proxy", docs_url=None, redoc_url=None)
    upstream = upstream.rstrip("/")
    names = dict(adapter_names or {})
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def route(messages: list[dict[str, Any]]) -> str:
        conversation = [Message.model_validate({k: v for k, v in m.items() if k in Message.model_fields}) for m in messages]
        alpha = composition.router.alphas([conversation])
        chosen = route_names(alpha, composition.slot_names)[0]
        return upstream_base_name if chosen is None else names.get(chosen, chosen)

    async def forward(method: str, path: str, body: bytes | None, request: Request, extra_headers: dict[str, str] | None = None) -> Response:
        forwarded = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        forwarded.update(headers)
        async with httpx.AsyncClient(timeout=timeout) as client:
            reply = await client.request(method, f"{upstream}{path}", content=body, headers=forwarded, params=request.query_params)
        out_headers = {"content-type": reply.headers.get("content-type", "application/json")} | (extra_headers or {})
        return Response(content=reply.content, status_code=reply.status_code, headers=out_headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            return JSONResponse({"error": {"message": "the body is not JSON", "type": "invalid_request_error"}}, status_code=400)
        if not isinstance(body, dict) or body.get("model") != served_model_name:
            return await forward("POST", "/chat/completions", raw, request)
        try:
            target = route(body.get("messages") or [])
        except Exception as e:  # noqa: BLE001 — a conversation the router cannot read
            return JSONResponse({"error": {"message": f"cannot route: {e}", "type": "invalid_request_error"}}, status_code=400)
        body["model"] = target
        reply = await forward("POST", "/chat/completions", json.dumps(body).encode(), request, {"x-tracerl-route": target})
        if reply.status_code == 200:  # answer under the name that was asked for
            data = json.loads(reply.body)
            data["model"] = served_model_name
            return JSONResponse(data, headers={"x-tracerl-route": target})
        return reply

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        reply = await forward("GET", "/models", None, request)
        if reply.status_code != 200:
            return reply
        data = json.loads(reply.body)
        data.setdefault("data", []).append({"id": served_model_name, "object": "model", "owned_by": "tracerl", "parent": upstream_base_name})
        return JSONResponse(data)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def passthrough(path: str, request: Request) -> Response:
        return await forward(request.method, f"/{path}", await request.body(), request)

    return app


def serve_router_proxy(composed_dir: str, upstream: str, *, host: str, port: int, served_model_name: str | None,
                       upstream_base_name: str | None, device: str | None = None) -> None:
    """`tracerl serve --router COMPOSED_DIR --upstream URL`: run the proxy in the foreground."""

    model = load_composed(composed_dir, device=device)
    composition = model.tracerl_composition
    if composition.router is None:
        raise InputError("--router needs a router or merge composition (tracerl compose --mode router)", path=composed_dir)
    if not upstream_base_name:
        try:
            listed = httpx.get(f"{upstream.rstrip('/')}/models", timeout=30).json()["data"]
            upstream_base_name = next(m["id"] for m in listed if not m.get("parent"))
        except (httpx.HTTPError, KeyError, StopIteration, ValueError) as e:
            raise InputError(f"cannot read the upstream's base model name from {upstream}/models ({e})") from None
    name = served_model_name or composition.name
    app = create_router_proxy(composition, upstream, served_model_name=name, upstream_base_name=upstream_base_name)
    uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
