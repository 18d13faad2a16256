"""The tool-call parser: well-formed calls, and every malformed case becomes an error the env answers."""

import pytest

from tracerl.models.parsing import INVALID_CALL_NAME, parse_assistant_text
from tracerl.envs.tools import Toolbox, tool


class Box(Toolbox):
    @tool("read")
    def get_price(self, item_id: str) -> dict:
        """Get a price.

        Args:
            item_id: The item.
        """
        return {"price": 1}


def test_plain_text_is_content():
    parsed = parse_assistant_text("  Hello there.  ")
    assert parsed.message.content == "Hello there."
    assert parsed.message.tool_calls is None and parsed.errors == []


def test_one_call_with_content_and_canonical_arguments():
    text = 'Let me check.\n<tool_call>\n{"name": "get_price", "arguments": {"b": 2, "a": "x"}}\n</tool_call>'
    parsed = parse_assistant_text(text)
    assert parsed.message.content == "Let me check."
    [call] = parsed.message.tool_calls
    assert call.id == "call_0" and call.name == "get_price"
    assert call.function.arguments == '{"a":"x","b":2}'
    assert parsed.errors == []


def test_two_calls_get_distinct_ids():
    block = '<tool_call>{"name": "get_price", "arguments": {"item_id": "A%d"}}</tool_call>'
    parsed = parse_assistant_text(block % 1 + block % 2, make_id=lambda k: f"c{10 + k}")
    assert [c.id for c in parsed.message.tool_calls] == ["c10", "c11"]
    assert [c.parsed_arguments() for c in parsed.message.tool_calls] == [{"item_id": "A1"}, {"item_id": "A2"}]
    assert parsed.message.content is None


@pytest.mark.parametrize(
    ("text", "error_in_reply"),
    [
        ('<tool_call>{"name": "get_price", "arguments": {"item_id": "A1"</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "get_price", "arguments": "A1"}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "unknown tool 'invalid_tool_call'"),
        ("<tool_call>not json at all</tool_call>", "unknown tool 'invalid_tool_call'"),
        ('<tool_call>{"name": "get_price", "arguments": {"item_id": "A1"}}', "unknown tool 'invalid_tool_call'"),
        ('<tool_call>{"name": "refund_everything", "arguments": {}}</tool_call>', "unknown tool 'refund_everything'"),
        ('<tool_call>{"name": "get_price", "arguments": {"sku": "A1"}}</tool_call>', "invalid arguments"),
    ],
)
def test_malformed_calls_become_error_replies(text, error_in_reply):
    parsed = parse_assistant_text(text)
    [call] = parsed.message.tool_calls
    reply = Box().call(call.function.name, call.function.arguments)
    assert reply.startswith("Error:") and error_in_reply in reply


def test_missing_closing_tag_is_reported():
    parsed = parse_assistant_text('Sure <tool_call>{"name": "get_price", "arguments": {}}')
    assert parsed.message.content == "Sure"
    assert parsed.message.tool_calls[0].name == INVALID_CALL_NAME
    assert parsed.errors == ["missing </tool_call>"]


@pytest.mark.parametrize("text", ["", "<tool_call>", "</tool_call>", "<tool_call></tool_call>", "{" * 5000, '<tool_call>{"name": 3}</tool_call>', "\x00\udcff"])
def test_never_raises(text):
    parsed = parse_assistant_text(text)
    assert parsed.message.role == "assistant"
