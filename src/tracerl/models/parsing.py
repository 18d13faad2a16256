"""Turn generated text into an assistant message (content + tool calls). Never raises.

The Hermes / Qwen3 format: each tool call is `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
(whitespace around the JSON allowed); the text outside the blocks is the content. A block that
is not well formed still becomes a tool call, built so that the environment answers it with an
"Error: …" tool message instead of the episode crashing:

- JSON that does not parse, or lacks a string "name": the name is recovered by a regex when it
  can be; the arguments are the raw text (not a JSON object ⇒ the toolbox reports it). When no
  name can be recovered the call is named `invalid_tool_call` (no tool has that name ⇒ "unknown
  tool").
- A missing closing tag: the call is named `invalid_tool_call` and its arguments carry the text,
  so the toolbox reports an unknown tool — the agent must close its tags.
- "arguments" that are a JSON object are re-serialised canonically (sorted keys, no spaces);
  anything else (a string, a list) is passed on as its JSON text, and the toolbox rejects it.
- An unknown tool name is kept as is: the environment's toolbox answers "unknown tool".

`ParsedMessage.errors` lists what was wrong, one short string per problem.

Other formats, named as vLLM's tool parsers name them (`TOOL_CALL_FORMATS`), chosen by
`tool_call_format(chat_template)` from the template that teaches the model its format:

- `qwen3_xml` (Qwen3-Coder, Qwen3.5/3.6): `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>…
  </function>\n</tool_call>`; a value is JSON where it parses as the parameter's schema type, else text.
- `llama3_json` (Llama 3.1–3.3): the answer is one JSON object `{"name": …, "parameters": {…}}` (or
  "arguments"), optionally after `<|python_tag|>`, several separated by ";".
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (v3 tokenizers), or
  `[TOOL_CALLS]NAME[ARGS]{…}` once per call (v11+).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tracerl.core.messages import FunctionCall, Message, ToolCall, canonical_json
from tracerl.core.tools import ToolSchema

TOOL_CALL_FORMATS = ("hermes", "qwen3_xml", "llama3_json", "mistral")

OPEN, CLOSE = "<tool_call>", "</tool_call>"
INVALID_CALL_NAME = "invalid_tool_call"
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]*)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*(.*)\}\s*$', re.DOTALL)


@dataclass
class ParsedMessage:
    message: Message
    errors: list[str] = field(default_factory=list)


def tool_call_format(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches (one of `TOOL_CALL_FORMATS`; hermes when it says none)."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_xml"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("<|eom_id|>" in template and '"parameters"' in template):
        return "llama3_json"
    return "hermes"


def parse_assistant_text(text: str, make_id: Callable[[int], str] | None = None, fmt: str = "hermes",
                         tools: list[ToolSchema] | None = None) -> ParsedMessage:
    """Split `text` into content and tool calls in the format `fmt`. `make_id(k)` names the k-th call
    (default call_k); `tools` give qwen3_xml's parameter types."""
    make_id = make_id or (lambda k: f"call_{k}")
    if fmt == "qwen3_xml":
        return _parse_qwen3_xml(text if isinstance(text, str) else "", make_id, tools or [])
    if fmt == "llama3_json":
        return _parse_llama3_json(text if isinstance(text, str) else "", make_id)
    if fmt == "mistral":
        return _parse_mistral(text if isinstance(text, str) else "", make_id)
    if fmt != "hermes":
        raise ValueError(f"unknown tool-call format '{fmt}' (known: {', '.join(TOOL_CALL_FORMATS)})")
    errors: list[str] = []
    content_parts: list[str] = []
    calls: list[ToolCall] = []
    rest = text if isinstance(text, str) else ""
    while True:
        start = rest.find(OPEN)
        if start < 0:
            content_parts.append(rest)
            break
        content_parts.append(rest[:start])
        after = rest[start + len(OPEN):]
        end = after.find(CLOSE)
        if end < 0:
            errors.append("missing </tool_call>")
            calls.append(_call(make_id(len(calls)), INVALID_CALL_NAME, canonical_json({"unclosed_tool_call": after.strip()})))
            break
        calls.append(_parse_block(after[:end], make_id(len(calls)), errors))
        rest = after[end + len(CLOSE):]
    content = "".join(content_parts).strip()
    if CLOSE in content:
        errors.append("stray </tool_call>")
    message = Message.assistant(content=content or None, tool_calls=calls or None)
    if message.content is None and message.tool_calls is None:
        message = Message.assistant(content="")
    return ParsedMessage(message=message, errors=errors)


def _parse_block(block: str, call_id: str, errors: list[str]) -> ToolCall:
    try:
        value = json.loads(block)
    except (json.JSONDecodeError, RecursionError):
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        args = value.get("arguments", {})
        if isinstance(args, dict):
            return _call(call_id, value["name"], canonical_json(args))
        errors.append(f"arguments of '{value['name']}' are not a JSON object")
        return _call(call_id, value["name"], json.dumps(args, ensure_ascii=False))
    name_match = _NAME_RE.search(block)
    if name_match is None:
        errors.append("tool call without a readable name")
        return _call(call_id, INVALID_CALL_NAME, canonical_json({"text": block.strip()}))
    errors.append(f"tool call '{name_match.group(1)}' is not valid JSON")
    args_match = _ARGS_RE.search(block)
    raw_args = args_match.group(1).strip() if args_match else block.strip()
    return _call(call_id, name_match.group(1), raw_args)


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


def _message(content: str, calls: list[ToolCall], errors: list[str]) -> ParsedMessage:
    message = Message.assistant(content=content.strip() or None, tool_calls=calls or None)
    if message.content is None and message.tool_calls is None:
        message = Message.assistant(content="")
    return ParsedMessage(message=message, errors=errors)


def _json_call(value: object, call_id: str, errors: list[str], arguments_keys: tuple[str, ...]) -> ToolCall:
    """A call from a decoded {"name", <arguments key>} object."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        errors.append("tool call without a readable name")
        return _call(call_id, INVALID_CALL_NAME, canonical_json({"text": json.dumps(value, ensure_ascii=False)}))
    args = next((value[k] for k in arguments_keys if k in value), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if isinstance(args, dict):
        return _call(call_id, value["name"], canonical_json(args))
    errors.append(f"arguments of '{value['name']}' are not a JSON object")
    return _call(call_id, value["name"], json.dumps(args, ensure_ascii=False))


_XML_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.S)


def _xml_value(raw: str, spec: dict) -> object:
    """A qwen3_xml parameter's text as its schema type says (text for strings, JSON for the rest where it parses)."""
    if spec.get("type") == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _parse_qwen3_xml(text: str, make_id: Callable[[int], str], tools: list[ToolSchema]) -> ParsedMessage:
    errors: list[str] = []
    calls: list[ToolCall] = []
    schemas = {t.name: t.parameters.get("properties", {}) for t in tools}
    start = text.find("<tool_call>")
    content = text if start < 0 else text[:start]
    for block in _XML_CALL.finditer(text[start:] if start >= 0 else ""):
        if not block.group(0).rstrip().endswith("</tool_call>"):
            errors.append("missing </tool_call>")
        function = _XML_FUNCTION.search(block.group(1))
        if function is None:
            errors.append("tool call without a readable name")
            calls.append(_call(make_id(len(calls)), INVALID_CALL_NAME, canonical_json({"text": block.group(1)})))
            continue
        name = function.group(1).strip()
        properties = schemas.get(name, {})
        arguments = {p.strip(): _xml_value(v, properties.get(p.strip(), {}))
                     for p, v in _XML_PARAMETER.findall(function.group(2))}
        calls.append(_call(make_id(len(calls)), name, canonical_json(arguments)))
    return _message(content, calls, errors)


_PYTHON_TAG = "<|python_tag|>"


def _parse_llama3_json(text: str, make_id: Callable[[int], str]) -> ParsedMessage:
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG):].strip()
    if not body.startswith("{"):
        return _message(text, [], [])
    errors: list[str] = []
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    rest = body
    while rest:
        try:
            value, end = decoder.raw_decode(rest)
        except (json.JSONDecodeError, RecursionError):
            errors.append("tool call is not valid JSON")
            name = _NAME_RE.search(rest)
            calls.append(_call(make_id(len(calls)), name.group(1) if name else INVALID_CALL_NAME,
                               canonical_json({"text": rest.strip()})))
            break
        calls.append(_json_call(value, make_id(len(calls)), errors, ("parameters", "arguments")))
        rest = rest[end:].strip().removeprefix(";").strip()
    return _message("", calls, errors)


_MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


def _parse_mistral(text: str, make_id: Callable[[int], str]) -> ParsedMessage:
    start = text.find(_MISTRAL_CALLS)
    if start < 0:
        return _message(text, [], [])
    content, errors, calls = text[:start], [], []
    parts = [p.strip() for p in text[start:].split(_MISTRAL_CALLS) if p.strip()]
    decoder = json.JSONDecoder()
    for part in parts:
        if _MISTRAL_ARGS in part:  # NAME[ARGS]{…}
            name, _, raw = part.partition(_MISTRAL_ARGS)
            try:
                args, _ = decoder.raw_decode(raw.strip())
            except (json.JSONDecodeError, RecursionError):
                errors.append(f"tool call '{name.strip()}' is not valid JSON")
                calls.append(_call(make_id(len(calls)), name.strip(), raw.strip()))
                continue
            calls.append(_json_call({"name": name.strip(), "arguments": args}, make_id(len(calls)), errors,
                                    ("arguments",)))
            continue
        try:  # [{"name": …, "arguments": {…}}, …]
            value, _ = decoder.raw_decode(part)
        except (json.JSONDecodeError, RecursionError):
            errors.append("tool calls are not valid JSON")
            calls.append(_call(make_id(len(calls)), INVALID_CALL_NAME, canonical_json({"text": part})))
            continue
        for item in value if isinstance(value, list) else [value]:
            calls.append(_json_call(item, make_id(len(calls)), errors, ("arguments", "parameters")))
    return _message(content, calls, errors)
