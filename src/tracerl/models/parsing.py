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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tracerl.core.messages import FunctionCall, Message, ToolCall, canonical_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
INVALID_CALL_NAME = "invalid_tool_call"
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]*)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*(.*)\}\s*$', re.DOTALL)


@dataclass
class ParsedMessage:
    message: Message
    errors: list[str] = field(default_factory=list)


def parse_assistant_text(text: str, make_id: Callable[[int], str] | None = None) -> ParsedMessage:
    """Split `text` into content and tool calls. `make_id(k)` names the k-th call (default call_k)."""
    make_id = make_id or (lambda k: f"call_{k}")
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
