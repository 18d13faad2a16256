"""OpenAI-compatible HTTP API over the local backend (FastAPI), shaped like vLLM's server.

    GET  /v1/models                   the base model and every loaded adapter / route
    POST /v1/chat/completions         messages (+ tools) -> assistant message with tool_calls
    POST /v1/completions              prompt text or token ids -> text, token ids, log-probs
    POST /v1/load_lora_adapter        {"lora_name", "lora_path"[, "load_inplace"]}
    POST /v1/unload_lora_adapter      {"lora_name"}

The `model` field picks the base model (its served name) or an adapter by name. Completions
accept vLLM's extensions `stop_token_ids`, `return_tokens_as_token_ids` ("token_id:N" tokens)
and `return_token_ids` (choices carry `token_ids`); log-probs follow the engine's
`logprobs_mode` (see `tracerl.models.generation`). Errors come back in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`: 400 malformed request or over-long prompt,
401 bad API key, 404 unknown model or adapter, 413 body too large, 503 queue full. A malformed
structure (JSON nested too deeply, a tool whose `function` is not an object, …) is a 400, never a 500.

Fair under load: the event loop only reads bodies and answers; parsing, validation, template
rendering and tokenization run in worker threads, generation on the engine's thread. A prompt whose
text is longer, in bytes, than the context could hold even at the vocabulary's longest token (UTF-8
bytes) is refused (400) before it is tokenized. A failed adapter load registers nothing
(`LocalPolicy.load_adapter`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error
from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.models.generation import GenerationRequest, GenerationResult
from tracerl.models.local import session_seed
from tracerl.serve.engine import Engine, QueueFull


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLarge", 503: "ServiceUnavailable"}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stream: bool = False

    @field_validator("top_k")
    @classmethod
    def _no_top_k(cls, v: int | None) -> int | None:
        if v is not None and v > 0:
            raise ValueError("top_k is not supported (use -1 or leave it out)")
        return v


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    stop_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class LoadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=200)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)


def create_app(
    engine: Engine,
    *,
    served_model_name: str = "base",
    api_key: str | None = None,
    max_tokens_limit: int = 1024,
    max_request_bytes: int = 1_000_000,
) -> FastAPI:
    """The FastAPI app; `engine` owns the model (its policy gives tokenizer, chat format, adapters)."""
    app = FastAPI(title="tracerl serve", docs_url=None, redoc_url=None)
    policy = engine.policy
    chat = policy.chat
    created = int(time.time())
    seeder = torch.Generator().manual_seed(secrets.randbits(62))
    longest_token = longest_token_bytes(policy.tokenizer)

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        body = {"error": {"message": message, "type": _TYPES.get(status, "Error"), "param": param, "code": status}}
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error(e.status, e.message, e.param)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        return error(500, f"internal error: {type(e).__name__}: {e}")

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')")

    async def parse(request: Request, model: type[BaseModel]) -> Any:
        authorize(request)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_request_bytes:
            raise APIError(413, f"request body larger than {max_request_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_request_bytes:
                raise APIError(413, f"request body larger than {max_request_bytes} bytes")
        return await asyncio.to_thread(_validate, b"".join(chunks), model)

    def adapter_for(name: str) -> str | None:
        if name == served_model_name:
            return None
        if name in policy.adapters:
            return name
        raise APIError(404, f"The model `{name}` does not exist.", "model")

    def budget(prompt_len: int, max_tokens: int | None) -> int:
        limit = policy.max_context
        if max_tokens is not None and max_tokens > max_tokens_limit:
            raise APIError(400, f"max_tokens is {max_tokens}; this server allows at most {max_tokens_limit}", "max_tokens")
        if prompt_len >= limit or (max_tokens is not None and prompt_len + max_tokens > limit):
            asked = max_tokens or 1
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{prompt_len + asked} tokens ({prompt_len} in the prompt, {asked} in the completion). "
                                "Please reduce the length of the prompt or completion.", "prompt")
        return max_tokens if max_tokens is not None else min(max_tokens_limit, limit - prompt_len)

    def generator(seed: int | None, k: int) -> torch.Generator:
        device = next(policy.model.parameters()).device
        g = torch.Generator(device=device)
        if seed is None:
            g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=seeder)))
        else:

            g.manual_seed(session_seed(seed, k))
        return g

    async def submit(start: Callable[[], Any]) -> Any:
        """Queue work on the engine's thread and await it: a full queue is 503, bad input 400."""
        try:
            future = start()
        except QueueFull as e:
            raise APIError(503, str(e)) from None
        try:
            return await asyncio.wrap_future(future)
        except InputError as e:
            raise APIError(400, str(e)) from None

    async def run(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await submit(lambda: engine.generate(requests))

    def check_text_length(n_bytes: int) -> None:
        """Refuse, before tokenizing it, text that needs more tokens than the context holds: at most
        `longest_token` bytes a token, n_bytes of text need at least n_bytes / longest_token tokens."""
        at_least = -(-n_bytes // longest_token)
        if at_least >= policy.max_context:
            raise APIError(400, f"This model's maximum context length is {policy.max_context} tokens. However, the "
                                f"prompt's {n_bytes} bytes of text need at least {at_least} tokens. Please reduce the "
                                "length of the prompt.", "messages")

    def check_ids(ids: list[int]) -> list[int]:
        vocab = len(policy.tokenizer)
        if not ids:
            raise APIError(400, "the prompt is empty", "prompt")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is out of range [0, {vocab})", "prompt")
        return ids

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        entries = [{"id": served_model_name, "object": "model", "created": created, "owned_by": "tracerl",
                    "root": served_model_name, "parent": None, "max_model_len": policy.max_context}]
        entries += [{"id": name, "object": "model", "created": created, "owned_by": "tracerl", "root": name,
                     "parent": served_model_name, "max_model_len": policy.max_context} for name in policy.adapters]
        return {"object": "list", "data": entries}

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        req: CompletionRequest = await parse(request, CompletionRequest)
        if req.stream or req.echo:
            raise APIError(400, "stream and echo are not supported", "stream" if req.stream else "echo")
        adapter = adapter_for(req.model)

        def prepare() -> list[list[int]]:  # in a worker thread: the loop stays free
            texts = [req.prompt] if isinstance(req.prompt, str) else [p for p in req.prompt if isinstance(p, str)]
            for text in texts:
                check_text_length(len(text.encode("utf-8", "surrogatepass")))
            return _prompts(req.prompt, chat)

        prompts = await asyncio.to_thread(prepare)
        stops = list(req.stop_token_ids or []) + list(chat.stop_ids)
        gen_requests = []
        for p, ids in enumerate(prompts):
            check_ids(ids)
            max_new = budget(len(ids), req.max_tokens)
            for k in range(req.n):
                gen_requests.append(GenerationRequest(
                    prompt_ids=ids, max_new_tokens=max_new, temperature=req.temperature, top_p=req.top_p,
                    stop_ids=stops, generator=generator(req.seed, p * req.n + k), extra=adapter,
                    top_logprobs=req.logprobs or 0))
        results = await run(gen_requests)
        choices = []
        for index, res in enumerate(results):
            text = chat.decode([t for t in res.token_ids if t not in chat.stop_ids])
            choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": res.finish_reason, "logprobs": None}
            if req.logprobs is not None:
                choice["logprobs"] = _completion_logprobs(res, chat, req.return_tokens_as_token_ids)
            if req.return_token_ids:
                choice["token_ids"] = res.token_ids
                choice["prompt_token_ids"] = prompts[index // req.n]
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts) * req.n
        completion_tokens = sum(len(r.token_ids) for r in results)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": req.model, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict[str, Any]:
        req: ChatRequest = await parse(request, ChatRequest)
        if req.stream:
            raise APIError(400, "stream is not supported", "stream")
        adapter = adapter_for(req.model)

        def prepare() -> tuple[list[ToolSchema] | None, list[int]]:  # in a worker thread: the loop stays free
            messages = _messages(req.messages)
            tools = _tools(req.tools)
            check_text_length(sum(_text_bytes(m) for m in messages))
            return tools, _render(chat, messages, tools)

        tools, ids = await asyncio.to_thread(prepare)
        check_ids(ids)
        max_new = budget(len(ids), req.max_completion_tokens or req.max_tokens)
        gen_requests = [GenerationRequest(prompt_ids=ids, max_new_tokens=max_new, temperature=req.temperature,
                                          top_p=req.top_p, stop_ids=chat.stop_ids, generator=generator(req.seed, k),
                                          extra=adapter, top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0)
                        for k in range(req.n)]
        results = await run(gen_requests)
        choices = []
        for index, res in enumerate(results):
            body = [t for t in res.token_ids if t not in chat.stop_ids]
            text = chat.decode(body)
            parsed = Message.assistant(text)  # no tools offered (e.g. a user simulator): the text is the answer
            if tools and req.tool_choice != "none":
                found = chat.parse(text, tools, make_id=lambda k: f"call_{uuid.uuid4().hex[:24]}")
                if not found.errors:  # a malformed call stays text, as vLLM's hermes parser leaves it
                    parsed = found.message
            message = parsed.to_openai()
            message.setdefault("content", None)
            finish = "tool_calls" if parsed.tool_calls else res.finish_reason
            choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
            if req.logprobs:
                choice["logprobs"] = {"content": _chat_logprobs(res, chat)}
            choices.append(choice)
        completion_tokens = sum(len(r.token_ids) for r in results)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": req.model, "choices": choices,
                "usage": {"prompt_tokens": len(ids) * req.n, "completion_tokens": completion_tokens,
                          "total_tokens": len(ids) * req.n + completion_tokens}}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        req: LoadAdapterRequest = await parse(request, LoadAdapterRequest)
        if req.lora_name == served_model_name:
            raise APIError(400, f"'{req.lora_name}' is the base model's name", "lora_name")
        if req.lora_name in policy.adapters and not req.load_inplace:
            raise APIError(400, f"The lora adapter '{req.lora_name}' has already been loaded.", "lora_name")
        await _engine_call(lambda: policy.load_adapter(req.lora_name, req.lora_path))
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        req: UnloadAdapterRequest = await parse(request, UnloadAdapterRequest)
        if req.lora_name not in policy.adapters:
            raise APIError(404, f"The lora adapter '{req.lora_name}' cannot be found.", "lora_name")
        await _engine_call(lambda: policy.unload_adapter(req.lora_name))
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    async def _engine_call(fn) -> Any:
        try:
            return await submit(lambda: engine.call(fn))
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 — the load left nothing registered (`LocalPolicy.load_adapter`)
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise APIError(400, f"cannot load the adapter: {first[:500]}") from None

    return app


def longest_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes any vocabulary entry is written with (at least the bytes it stands for)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(1, *(len(str(t).encode("utf-8", "surrogatepass")) for t in tokens if t is not None))


def _validate(body: bytes, model: type[BaseModel]) -> Any:
    """The request body as `model` (in a worker thread); anything malformed is a 400."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON ({e})") from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise APIError(400, describe_validation_error(e)) from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply") from None


def _text_bytes(message: Message) -> int:
    """The UTF-8 bytes of a message's text: its content and its tool calls' names and arguments."""
    calls = sum(len(c.function.name.encode("utf-8", "surrogatepass")) + len(c.function.arguments.encode("utf-8", "surrogatepass"))
                for c in message.tool_calls or [])
    return len((message.content or "").encode("utf-8", "surrogatepass")) + calls


def _render(chat: Any, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
    """The prompt's token ids (in a worker thread); a conversation the template rejects is a 400."""
    try:
        return chat.prompt_ids(messages, tools)
    except RecursionError:
        raise APIError(400, "the messages are nested too deeply", "messages") from None
    except Exception as e:  # noqa: BLE001 — a template that rejects the conversation
        raise APIError(400, f"the chat template cannot render these messages: {e}", "messages") from None


def _prompts(prompt: Any, chat: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [chat.encode(prompt)]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    return [chat.encode(p) if isinstance(p, str) else list(p) for p in prompt]


def _messages(raw: list[dict[str, Any]]) -> list[Message]:
    out = []
    for i, m in enumerate(raw):
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise APIError(400, f"messages[{i}].content: a text part's 'text' must be a string", "messages")
            m["content"] = "".join(texts)
        if isinstance(m.get("tool_calls"), list):  # keys beyond OpenAI's (τ²-bench adds a call's "name") are ignored
            m["tool_calls"] = [_known_call_keys(c) for c in m["tool_calls"]]
        try:
            out.append(Message.model_validate({k: v for k, v in m.items() if k in Message.model_fields}))
        except ValidationError as e:
            raise APIError(400, f"messages[{i}]: {describe_validation_error(e)}", "messages") from None
        except RecursionError:
            raise APIError(400, f"messages[{i}] is nested too deeply", "messages") from None
    return out


def _known_call_keys(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    out = {k: v for k, v in call.items() if k in ("id", "type", "function")}
    if isinstance(out.get("function"), dict):
        out["function"] = {k: v for k, v in out["function"].items() if k in ("name", "arguments")}
    return out


def _tools(raw: list[dict[str, Any]] | None) -> list[ToolSchema] | None:
    if not raw:
        return None
    tools = []
    for i, entry in enumerate(raw):
        function = entry.get("function", entry)
        if not isinstance(function, dict):
            raise APIError(400, f"tools[{i}].function must be an object, not {type(function).__name__}", "tools")
        if not isinstance(function.get("name"), str) or not isinstance(function.get("parameters", {}), dict):
            raise APIError(400, f"tools[{i}].function needs a string 'name' and an object 'parameters'", "tools")
        try:
            tools.append(ToolSchema.from_openai(entry))
        except ValidationError as e:
            raise APIError(400, f"tools[{i}] is not an OpenAI function tool ({describe_validation_error(e)})",
                           "tools") from None
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise APIError(400, f"tools[{i}] is not an OpenAI function tool ({type(e).__name__})", "tools") from None
    return tools


def _token_text(chat: Any, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else chat.decode([token])


def _completion_logprobs(res: GenerationResult, chat: Any, as_ids: bool) -> dict[str, Any]:
    tokens = [_token_text(chat, t, as_ids) for t in res.token_ids]
    offsets, pos = [], 0
    for text in (chat.decode([t]) for t in res.token_ids):
        offsets.append(pos)
        pos += len(text)
    top = None
    if res.top_logprobs:
        top = [{_token_text(chat, t, as_ids): lp for t, lp in step} for step in res.top_logprobs]
    return {"tokens": tokens, "token_logprobs": res.logprobs, "top_logprobs": top, "text_offset": offsets}


def _chat_logprobs(res: GenerationResult, chat: Any) -> list[dict[str, Any]]:
    out = []
    for k, (t, lp) in enumerate(zip(res.token_ids, res.logprobs, strict=True)):
        text = chat.decode([t])
        top = res.top_logprobs[k] if res.top_logprobs else []
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                    "top_logprobs": [{"token": chat.decode([a]), "logprob": v, "bytes": list(chat.decode([a]).encode())} for a, v in top]})
    return out

