"""Chat format: prompting through the tokenizer's chat template, and exact multi-turn token records.

`ChatFormat` renders conversations with `tokenizer.apply_chat_template(messages, tools=…)` and
keeps each episode's `Session.tokens` (a `TokenRecord`) by appending, never by re-templating:

1. First call: `ids` = the templated initial conversation (system + first user turn) with the
   assistant generation header; `prompt_len = len(ids)`, so `ids[:prompt_len]` is everything the
   model saw before its first sampled token (mask 0, log-prob 0).
2. Each model turn appends the sampled tokens exactly as sampled, with their sampling log-probs
   and mask 1 — the end-of-turn token (`<|im_end|>`) included when the model produced it. A turn
   cut by `max_new_tokens`, or ended by another stop token (e.g. `<|endoftext|>`), is closed by
   appending `<|im_end|>` as context (mask 0, log-prob 0) before the next turn.
3. Each later call appends the templated tokens of the new user/tool turns plus the next
   generation header (mask 0, log-prob 0). They are found as the text that the template puts
   after the k-th end-of-turn marker, k being the number of turns already recorded, so the
   formatting the template gives *earlier* turns never leaks in.

When this equals a fresh templating of the finished conversation — ids identical — and when not:

- Equal when the template is prefix-preserving (rendering a conversation and then appending
  turns never changes the text of earlier turns — true of ChatML templates such as the tiny
  agent's and Qwen2.5's) **and** every assistant turn's sampled tokens are the tokenizer's own
  encoding of the template's rendering of the parsed message (the model wrote the canonical
  text). `tests/models/test_chat.py` checks this.
- Not equal with Qwen3's template, which is not prefix-preserving: it strips `<think>…</think>`
  from assistant turns before the last user query and adds an empty `<think>\\n\\n</think>\\n\\n`
  to the final assistant turn. The record keeps what the model actually saw and produced, which
  is what the importance ratio and the loss must use; a fresh templating would not.
- Not equal when the model wrote a non-canonical tokenization of its text (e.g. "ab" as "a","b"),
  or text the parser normalises (spacing in tool-call JSON, argument key order). Again the record
  is the truth; re-templating would silently change the trained tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.core.messages import Message, ToolCall
from tracerl.core.policy import Session
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import TokenRecord
from tracerl.models.parsing import (
    TOOL_CALL_FORMATS,
    ParsedMessage,
    parse_assistant_text,
    tool_call_format,
)
from tracerl.models.templates import END_OF_TURN

_USER_TURN = re.compile(re.escape("<|im_start|>user\n") + "(.*?)" + re.escape(END_OF_TURN), flags=re.S)


def first_user_turn(conversation: str | Sequence[Message | dict]) -> str | None:
    """The content of the first user turn: of a conversation (Message objects or OpenAI dicts), or of
    a ChatML-rendered prompt (`<|im_start|>user\\n…<|im_end|>`, the format of `tracerl.models.templates`).
    None when there is no user turn, or the rendered prompt stops before the turn's end."""
    if isinstance(conversation, str):
        match = _USER_TURN.search(conversation)
        return match.group(1) if match else None
    for m in conversation:
        role = m.role if isinstance(m, Message) else m.get("role")
        if role == "user":
            content = m.content if isinstance(m, Message) else m.get("content")
            return content or ""
    return None


def first_user_turn_span(text: str) -> tuple[int, int] | None:
    """Where the first user turn of a ChatML-rendered text lies: from its `<|im_start|>user` to the
    end of its `<|im_end|>`; None when the text has no whole user turn."""
    match = _USER_TURN.search(text)
    return match.span() if match else None


def template_messages(messages: Sequence[Message | dict]) -> list[dict]:
    """Messages as chat templates take them, as vLLM and transformers hand them over: OpenAI dicts whose tool
    calls' arguments are objects (the template writes them in its model's format: Hermes JSON, Qwen3 XML
    parameters, …), the text as it is where it is no JSON object (a malformed call the model wrote)."""
    out = []
    for m in messages:
        d = m.to_openai() if isinstance(m, Message) else m
        calls = d.get("tool_calls") if d.get("role") == "assistant" else None
        if calls:
            d = {**d, "tool_calls": [_with_parsed_arguments(c) for c in calls]}
        out.append(d)
    return out


def _with_parsed_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return call
    return {**call, "function": {**function, "arguments": parsed}} if isinstance(parsed, dict) else call


@dataclass
class ChatState:
    """Per-session bookkeeping, kept in `Session.state` by model policies."""

    messages_recorded: int = 0  # session.messages[:messages_recorded] are in session.tokens
    calls: int = 0  # tool calls parsed so far (for unique call ids)
    turn_closed: bool = True  # the last sampled turn ended with the end-of-turn token
    parse_errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # backend-private (e.g. a sampling generator)


class ChatFormat:
    """A tokenizer's chat template, tool-call parser and end-of-turn token, with exact bookkeeping.

    `template_kwargs` go to `apply_chat_template` (e.g. `{"enable_thinking": False}` for Qwen3). The
    tool-call format the model's answers are parsed in (`tracerl.models.parsing.TOOL_CALL_FORMATS`) is
    `tool_format`, else the key `tool_call_format` of the model's tokenizer_config.json, else the one its
    chat template teaches (`tool_call_format`).
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, end_of_turn: str | None = None,
                 tool_format: str | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        configured = (getattr(tokenizer, "init_kwargs", None) or {}).get("tool_call_format")
        self.tool_format = tool_format or configured or tool_call_format(tokenizer.chat_template)
        if self.tool_format not in TOOL_CALL_FORMATS:
            raise ValueError(f"unknown tool-call format '{self.tool_format}' (known: {', '.join(TOOL_CALL_FORMATS)})")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        vocab = tokenizer.get_vocab()
        self.end_of_turn = end_of_turn or (END_OF_TURN if END_OF_TURN in vocab else tokenizer.eos_token)
        self.end_of_turn_id = vocab[self.end_of_turn]
        stops = {self.end_of_turn_id}
        if tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        self.stop_ids = sorted(stops)

    # --- rendering ------------------------------------------------------------------------
    def render(self, messages: list[Message] | list[dict], tools: list[ToolSchema] | None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            template_messages(messages),
            tools=[t.to_openai() for t in tools] if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        """A fresh templating of `messages` with the generation header (what a server would build)."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation_text(self, history: list[Message], new: list[Message], tools: list[ToolSchema] | None) -> str:
        """The text the template puts after the last turn of `history` for the `new` turns, plus the header.

        History must end with an assistant turn; the text starts right after that turn's end-of-turn
        marker (e.g. the "\\n" after `<|im_end|>`).
        """
        k = self.render(history, tools, add_generation_prompt=False).count(self.end_of_turn)
        full = self.render(list(history) + list(new), tools, add_generation_prompt=True)
        pos = 0
        for _ in range(k):
            found = full.find(self.end_of_turn, pos)
            if found < 0:
                raise ValueError("the chat template does not end every turn with the end-of-turn marker")
            pos = found + len(self.end_of_turn)
        return full[pos:]

    def tool_rendering_problem(self) -> str | None:
        """What the chat template fails to render of a tool-using conversation — the tools, a call with its
        arguments, the tool's result — or the call not parsed back from its rendered turn in `tool_format`;
        None when it renders them all. (A template written for chat alone, such as SmolLM2's, fails.)"""
        tool = ToolSchema(name="lookup_record", description="Look a record up.", kind="read", parameters={
            "type": "object", "properties": {"record_id": {"type": "string"}}, "required": ["record_id"]})
        call = ToolCall.make("lookup_record", {"record_id": "R-7291"}, "call_0")
        opening = [Message.system("You look records up."), Message.user("What is the status of my record?")]
        turn = Message.assistant(tool_calls=[call])
        result = Message.tool("status: archived since 5530", tool_call_id="call_0", name="lookup_record")
        try:
            prompt = self.render(opening, [tool], add_generation_prompt=True)
            with_call = self.render([*opening, turn], [tool], add_generation_prompt=False)
            with_result = self.render([*opening, turn, result], [tool], add_generation_prompt=True)
        except Exception as e:  # a template's own errors (jinja, or a raise_exception in it) come in any type
            return f"the chat template fails on a tool-calling conversation ({type(e).__name__}: {str(e)[:200]})"
        if "lookup_record" not in prompt:  # the only mentions of the tool's name and the call's arguments
            return "the chat template does not render the tools"
        if "R-7291" not in with_call:
            return "the chat template does not render an assistant turn's tool calls"
        if "archived since 5530" not in with_result:
            return "the chat template does not render tool results"
        if with_call.startswith(prompt):
            answer = with_call[len(prompt):].rsplit(self.end_of_turn, 1)[0]
            parsed = self.parse(answer, [tool]).message.tool_calls or []
            if [(c.name, c.parsed_arguments()) for c in parsed] != [("lookup_record", {"record_id": "R-7291"})]:
                return f"the chat template's tool calls do not parse back in the format '{self.tool_format}'"
        return None

    def parse(self, text: str, tools: list[ToolSchema] | None, make_id: Any = None) -> ParsedMessage:
        """An answer's text as a message, in this model's tool-call format."""
        return parse_assistant_text(text, make_id=make_id, fmt=self.tool_format, tools=tools)

    # --- bookkeeping ----------------------------------------------------------------------
    def prepare(self, session: Session) -> list[int]:
        """Bring `session.tokens` up to date with `session.messages`; return the ids to sample after."""
        state = session.state if isinstance(session.state, ChatState) else None
        if session.tokens is None or state is None:
            state = ChatState()
            session.state = state
            ids = self.prompt_ids(session.messages, session.tools)
            session.tokens = TokenRecord(ids=ids, logprobs=[0.0] * len(ids), mask=[0] * len(ids), prompt_len=len(ids))
        else:
            new = session.messages[state.messages_recorded:]
            history = session.messages[: state.messages_recorded]
            if not state.turn_closed:
                _append(session.tokens, [self.end_of_turn_id], None)
                state.turn_closed = True
            if new:
                ids = self.encode(self.continuation_text(history, new, session.tools))
                _append(session.tokens, ids, None)
        state.messages_recorded = len(session.messages)
        return list(session.tokens.ids)

    def record(self, session: Session, token_ids: list[int], logprobs: list[float]) -> ParsedMessage:
        """Append a sampled turn (mask 1) to the session's tokens and parse it into a message.

        Call after `prepare`; the runner then appends the returned message to `session.messages`.
        """
        state: ChatState = session.state
        assert session.tokens is not None, "record() before prepare()"
        _append(session.tokens, list(token_ids), list(logprobs))
        state.turn_closed = bool(token_ids) and token_ids[-1] == self.end_of_turn_id
        body = token_ids[:-1] if token_ids and token_ids[-1] in self.stop_ids else token_ids
        first = state.calls
        parsed = self.parse(self.decode(list(body)), session.tools, make_id=lambda k: f"call_{first + k}")
        state.calls += len(parsed.message.tool_calls or [])
        state.parse_errors.extend(parsed.errors)
        state.messages_recorded = len(session.messages) + 1  # the reply the runner is about to append
        return parsed


def _append(record: TokenRecord, ids: list[int], logprobs: list[float] | None) -> None:
    record.ids.extend(ids)
    if logprobs is None:
        record.logprobs.extend([0.0] * len(ids))
        record.mask.extend([0] * len(ids))
    else:
        if len(logprobs) != len(ids):
            raise ValueError("one log-prob per sampled token")
        record.logprobs.extend(float(x) for x in logprobs)
        record.mask.extend([1] * len(ids))
