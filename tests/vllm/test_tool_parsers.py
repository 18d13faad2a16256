"""tracerl's tool-call formats against vLLM's own parsers of the same names (hermes, qwen3_xml, llama3_json,
mistral; vLLM's CPU build in its venv, run by vllm_tool_parsers.py as a subprocess):

- calls rendered by our `ChatFormat` through a chat template of each format (written here, in the format each
  family's template teaches) are read back, by vLLM's parser and by ours, as the calls rendered;
- Mistral's calls as Mistral's own tokenizer (mistral_common: v3 and v7 SentencePiece, v3 Tekken) renders them
  are read back by both;
- answers a model writes in each format (no newlines, content before the calls, `<|python_tag|>`, …) give
  both parsers the same calls and content.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tracerl.core.messages import Message, ToolCall
from tracerl.core.tools import ToolSchema
from tracerl.models.chat import ChatFormat
from tracerl.models.parsing import parse_assistant_text
from tracerl.models.templates import _TOOL_CALLS_CANONICAL, CHATML_TEMPLATE
from tracerl.models.tiny_agent import TINY_AGENT_DIR
from vllm_servers import python_or_skip

HELPER = Path(__file__).parent / "vllm_tool_parsers.py"

# ChatML turns; the assistant's calls in the Qwen3-Coder / Qwen3.5 XML format, values as text when they are
# strings, as JSON otherwise.
QWEN3_XML_CALLS = r"""
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- for name, value in tool_call.arguments | items %}
                    {{- '<parameter=' + name + '>\n' }}
                    {%- if value is string %}{{- value }}{%- else %}{{- value | tojson }}{%- endif %}
                    {{- '\n</parameter>\n' }}
                {%- endfor %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}"""
# Llama 3.1's custom-tool format: one JSON object with "parameters" (`<|python_tag|>` marks its built-in tools).
LLAMA3_JSON_CALLS = r"""
        {%- if message.tool_calls %}
            {%- if builtin_tools is defined %}{{- '<|python_tag|>' }}{%- endif %}
            {%- set tool_call = message.tool_calls[0].function %}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
        {%- endif %}
        {{- '<|im_end|>\n' }}"""
TEMPLATES = {
    "hermes": CHATML_TEMPLATE,
    "qwen3_xml": CHATML_TEMPLATE.replace(_TOOL_CALLS_CANONICAL, QWEN3_XML_CALLS),
    "llama3_json": CHATML_TEMPLATE.replace(_TOOL_CALLS_CANONICAL, LLAMA3_JSON_CALLS),
}
RENEW = ToolSchema(name="renew_loan", kind="write", description="Renew a loan.", parameters={
    "type": "object", "required": ["loan_id"], "properties": {
        "loan_id": {"type": "string"}, "weeks": {"type": "integer"}, "notify": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}}, "note": {"type": "string"}}})
DETAILS = ToolSchema(name="get_loan_details", kind="read", description="Get a loan.", parameters={
    "type": "object", "required": ["loan_id"], "properties": {"loan_id": {"type": "string"}}})
TOOLS = [RENEW, DETAILS]
OPENAI_TOOLS = [t.to_openai() for t in TOOLS]
RENEWAL = ("renew_loan", {"loan_id": "4821", "weeks": 3, "notify": True, "tags": ["urgent", "reading room"],
                          "note": "Renew it, please: the member is away."})
LOOKUP = ("get_loan_details", {"loan_id": "L-17"})
# (format, content, calls): what each format's turns hold (Llama 3.1 makes one call a turn, with no text)
TURNS = [("hermes", "Let me renew it.", [RENEWAL, LOOKUP]), ("hermes", None, [LOOKUP]),
         ("qwen3_xml", "Let me renew it.", [RENEWAL, LOOKUP]), ("qwen3_xml", None, [RENEWAL]),
         ("llama3_json", None, [RENEWAL]), ("llama3_json", None, [LOOKUP])]
MISTRAL_TOKENIZERS = ["mistral_instruct_tokenizer_240323.model.v3", "mistral_instruct_tokenizer_241114.model.v7",
                      "tekken_240911.json"]
# Answers as models write them, beside what the templates render.
WRITTEN = [
    ("hermes", '<tool_call>{"name": "get_loan_details", "arguments": {"loan_id": "L-17"}}</tool_call>'),
    ("hermes", 'Checking.\n<tool_call>\n{"name": "renew_loan", "arguments": {"loan_id": "L-1", "weeks": 2}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_loan_details", "arguments": {"loan_id": "L-1"}}\n</tool_call>'),
    ("qwen3_xml", "<tool_call>\n<function=renew_loan>\n<parameter=loan_id>\nL-1\n</parameter>\n<parameter=weeks>\n2\n"
                  "</parameter>\n<parameter=notify>\nfalse\n</parameter>\n</function>\n</tool_call>"),
    ("qwen3_xml", "I will look.\n<tool_call>\n<function=get_loan_details>\n<parameter=loan_id>\n0042\n</parameter>\n"
                  "</function>\n</tool_call>"),
    ("llama3_json", '<|python_tag|>{"name": "get_loan_details", "parameters": {"loan_id": "L-17"}}'),
    ("llama3_json", '{"name": "renew_loan", "arguments": {"loan_id": "L-1"}}'),
    ("llama3_json", '{"name": "renew_loan", "parameters": {"loan_id": "L-1"}}; '
                    '{"name": "get_loan_details", "parameters": {"loan_id": "L-2"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_loan_details", "arguments": {"loan_id": "L-17"}}]'),
    ("mistral", 'Sure.[TOOL_CALLS] [{"name": "renew_loan", "arguments": {"loan_id": "L-1", "weeks": 2}}, '
                '{"name": "get_loan_details", "arguments": {"loan_id": "L-1"}}]'),
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tokenizer directory per format: the tiny agent's (its markup tokens include <tool_call>), plus Llama 3's
    <|python_tag|> for llama3_json (vLLM's parser needs it in the vocabulary); Mistral's ship with mistral_common."""
    llama = tmp_path_factory.mktemp("tokenizers") / "llama3_json"
    tok = AutoTokenizer.from_pretrained(TINY_AGENT_DIR)
    tok.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})
    tok.save_pretrained(llama)
    return {"hermes": str(TINY_AGENT_DIR), "qwen3_xml": str(TINY_AGENT_DIR), "llama3_json": str(llama)}


def in_vllm(request: dict) -> dict:
    done = subprocess.run([str(python_or_skip()), str(HELPER)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def rendered_turn(tokenizer_dir: str, fmt: str, content: str | None, calls: list[tuple[str, dict]]) -> str:
    """The assistant turn's text as our ChatFormat renders it through the format's template."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = TEMPLATES[fmt]
    chat = ChatFormat(tok)
    assert chat.tool_format == fmt and chat.tool_rendering_problem() is None
    opening = [Message.system("You manage library loans."), Message.user("Renew my loan 4821, please.")]
    turn = Message.assistant(content=content, tool_calls=[ToolCall.make(n, a, f"call_{k}") for k, (n, a) in enumerate(calls)])
    prompt = chat.render(opening, TOOLS, add_generation_prompt=True)
    full = chat.render([*opening, turn], TOOLS, add_generation_prompt=False)
    assert full.startswith(prompt) and full.endswith(chat.end_of_turn + "\n")
    return full[len(prompt):-len(chat.end_of_turn + "\n")]


def ours(text: str, fmt: str) -> tuple[str | None, list[tuple[str, dict]]]:
    parsed = parse_assistant_text(text, fmt=fmt, tools=TOOLS)
    assert parsed.errors == [], (text, parsed.errors)
    message = parsed.message
    return (message.content or "").strip() or None, [(c.name, json.loads(c.function.arguments))
                                                      for c in message.tool_calls or []]


def theirs(found: dict) -> tuple[str | None, list[tuple[str, dict]]]:
    assert found["tools_called"], found
    return (found["content"] or "").strip() or None, [(name, json.loads(args)) for name, args in found["calls"]]


def test_our_formats_read_as_vllms_parsers_read_them(tokenizers: dict[str, str]) -> None:
    texts = [rendered_turn(tokenizers[fmt], fmt, content, calls) for fmt, content, calls in TURNS]
    assert "<function=renew_loan>\n<parameter=loan_id>\n4821\n</parameter>" in texts[2]  # the XML format, not JSON
    mistral = [{"tokenizer": name, "calls": [{"name": n, "arguments": a} for n, a in [RENEWAL, LOOKUP]],
                "tools": OPENAI_TOOLS} for name in MISTRAL_TOKENIZERS]
    cases = [{"parser": fmt, "tokenizer": tokenizers[fmt], "text": text, "tools": OPENAI_TOOLS}
             for (fmt, _, _), text in zip(TURNS, texts, strict=True)]
    cases += [{"parser": fmt, "tokenizer": tokenizers.get(fmt, f"mistral:{MISTRAL_TOKENIZERS[0]}"), "text": text,
               "tools": OPENAI_TOOLS} for fmt, text in WRITTEN]
    first = in_vllm({"parse": cases, "mistral": mistral})
    mistral_texts = first["mistral"]
    assert all(t.startswith("[TOOL_CALLS]") for t in mistral_texts), mistral_texts
    mistral_found = in_vllm({"parse": [{"parser": "mistral", "tokenizer": f"mistral:{name}", "text": text,
                                        "tools": OPENAI_TOOLS} for name, text in zip(MISTRAL_TOKENIZERS, mistral_texts,
                                                                                      strict=True)]})["parse"]

    for (fmt, content, calls), text, found in zip(TURNS, texts, first["parse"], strict=False):
        expected = (content, [(n, a) for n, a in calls])
        assert ours(text, fmt) == expected, (fmt, text)
        assert theirs(found) == expected, (fmt, text, found)
    for text, found in zip(mistral_texts, mistral_found, strict=True):
        expected = (None, [RENEWAL, LOOKUP])
        assert ours(text, "mistral") == expected, text
        assert theirs(found) == expected, (text, found)
    for (fmt, text), found in zip(WRITTEN, first["parse"][len(TURNS):], strict=True):
        assert ours(text, fmt) == theirs(found), (fmt, text, found)
