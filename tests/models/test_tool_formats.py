"""Tool-call formats beyond Hermes: parsing each as vLLM's parser of that name reads it, and the format
chosen from the model's chat template (or the key `tool_call_format` of its tokenizer_config.json)."""

from __future__ import annotations

import json

import pytest

from tracerl.core.tools import ToolSchema
from tracerl.models.chat import ChatFormat
from tracerl.models.local import load_model
from tracerl.models.parsing import parse_assistant_text, tool_call_format
from tracerl.models.templates import QWEN3_TEMPLATE, TINY_AGENT_TEMPLATE

RENEW = ToolSchema(name="renew_loan", kind="write", parameters={
    "type": "object", "properties": {"loan_id": {"type": "string"}, "weeks": {"type": "integer"},
                                     "notify": {"type": "boolean"}}, "required": ["loan_id"]})


def calls(parsed) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in parsed.message.tool_calls or []]


def test_qwen3_xml_values_take_their_schema_types() -> None:
    text = ("Let me renew it.\n<tool_call>\n<function=renew_loan>\n<parameter=loan_id>\n4821\n</parameter>\n"
            "<parameter=weeks>\n3\n</parameter>\n<parameter=notify>\ntrue\n</parameter>\n</function>\n</tool_call>")
    parsed = parse_assistant_text(text, fmt="qwen3_xml", tools=[RENEW])
    assert parsed.errors == [] and parsed.message.content == "Let me renew it."
    assert calls(parsed) == [("renew_loan", {"loan_id": "4821", "weeks": 3, "notify": True})]  # "4821" stays a string
    two = text + "\n<tool_call>\n<function=get_loan_details>\n<parameter=loan_id>\nL-1\n</parameter>\n</function>\n</tool_call>"
    assert [name for name, _ in calls(parse_assistant_text(two, fmt="qwen3_xml", tools=[RENEW]))] == [
        "renew_loan", "get_loan_details"]
    cut = parse_assistant_text("<tool_call>\n<function=renew_loan>\n<parameter=loan_id>\nL-1", fmt="qwen3_xml")
    assert cut.errors == ["missing </tool_call>"] and calls(cut) == [("renew_loan", {"loan_id": "L-1"})]
    nameless = parse_assistant_text("<tool_call>\nrenew it\n</tool_call>", fmt="qwen3_xml")
    assert calls(nameless)[0][0] == "invalid_tool_call" and nameless.errors == ["tool call without a readable name"]


def test_llama3_json_with_parameters_and_the_python_tag() -> None:
    parsed = parse_assistant_text('<|python_tag|>{"name": "renew_loan", "parameters": {"loan_id": "L-1"}}; '
                                  '{"name": "return_loan", "arguments": {"loan_id": "L-2"}}', fmt="llama3_json")
    assert parsed.errors == [] and parsed.message.content is None
    assert calls(parsed) == [("renew_loan", {"loan_id": "L-1"}), ("return_loan", {"loan_id": "L-2"})]
    assert parse_assistant_text("I cannot renew it: it is overdue.", fmt="llama3_json").message.content == \
        "I cannot renew it: it is overdue."
    bad = parse_assistant_text('{"name": "renew_loan", "parameters": {"loan_id": ', fmt="llama3_json")
    assert bad.errors == ["tool call is not valid JSON"] and calls(bad)[0][0] == "renew_loan"


def test_mistral_both_generations() -> None:
    v3 = parse_assistant_text('[TOOL_CALLS] [{"name": "renew_loan", "arguments": {"loan_id": "L-1"}}]', fmt="mistral")
    assert v3.errors == [] and calls(v3) == [("renew_loan", {"loan_id": "L-1"})]
    v11 = parse_assistant_text('Sure.[TOOL_CALLS]renew_loan[ARGS]{"loan_id": "L-1"}[TOOL_CALLS]return_loan[ARGS]'
                               '{"loan_id": "L-2"}', fmt="mistral")
    assert v11.message.content == "Sure." and calls(v11) == [("renew_loan", {"loan_id": "L-1"}),
                                                             ("return_loan", {"loan_id": "L-2"})]
    bad = parse_assistant_text('[TOOL_CALLS]renew_loan[ARGS]{"loan_id": ', fmt="mistral")
    assert bad.errors == ["tool call 'renew_loan' is not valid JSON"]


def test_hermes_is_unchanged_and_an_unknown_format_is_refused() -> None:
    parsed = parse_assistant_text('<tool_call>\n{"name": "renew_loan", "arguments": {"loan_id": "L-1"}}\n</tool_call>')
    assert calls(parsed) == [("renew_loan", {"loan_id": "L-1"})]
    with pytest.raises(ValueError, match="unknown tool-call format 'pythonic'"):
        parse_assistant_text("x", fmt="pythonic")


def test_the_format_comes_from_the_template_or_the_tokenizer_config(tmp_path) -> None:
    assert tool_call_format(QWEN3_TEMPLATE) == tool_call_format(TINY_AGENT_TEMPLATE) == "hermes"
    assert tool_call_format("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' }}") == "qwen3_xml"
    assert tool_call_format("{{- '[TOOL_CALLS]' + tool_calls|tojson }}") == "mistral"
    assert tool_call_format("{{- '<|python_tag|>' + tool_call.arguments.code }}") == "llama3_json"
    _, tokenizer = load_model("tiny-agent")
    assert ChatFormat(tokenizer).tool_format == "hermes"
    assert ChatFormat(tokenizer, tool_format="qwen3_xml").tool_format == "qwen3_xml"
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tool_call_format": "llama3_json"}))
    from transformers import AutoTokenizer

    assert ChatFormat(AutoTokenizer.from_pretrained(tmp_path)).tool_format == "llama3_json"
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        ChatFormat(tokenizer, tool_format="xml")
