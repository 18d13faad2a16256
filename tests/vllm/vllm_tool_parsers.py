"""vLLM's own tool parsers, and Mistral's own tokenizer, run in the vLLM venv (test_tool_parsers.py starts this
script with $TRACERL_VLLM_PYTHON; it imports nothing of tracerl). Reads one JSON request on stdin, writes one
JSON answer on stdout:

    {"parse": [{"parser": "hermes", "tokenizer": DIR | "mistral:FILE", "text": …, "tools": [openai tools]}, …],
     "mistral": [{"tokenizer": FILE, "content": …, "calls": [{"name": …, "arguments": {…}}], "tools": […]}, …]}
    → {"parse": [{"tools_called": bool, "calls": [[name, arguments JSON text]], "content": str | null}, …],
       "mistral": [the assistant turn's text as vLLM's detokenizer gives it to the parser, from [TOOL_CALLS] on], …]}

"parse": `ToolParserManager.get_tool_parser(parser)(tokenizer, tools).extract_tool_calls(text, request)`, what
vLLM's server runs on a whole answer (`--enable-auto-tool-choice --tool-call-parser NAME`). "mistral":
mistral_common (Mistral's reference tokenizer) encodes a conversation whose assistant turn makes the calls;
FILE is one of the tokenizers mistral_common ships (mistral_common/data).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import mistral_common
from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest as MistralRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from transformers import AutoTokenizer
from transformers.tokenization_mistral_common import MistralCommonBackend
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tokenizers.mistral import MistralTokenizer
from vllm.tool_parsers import ToolParserManager

MISTRAL_DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
_tokenizers: dict[str, object] = {}


def tokenizer(spec: str):
    if spec not in _tokenizers:
        if spec.startswith("mistral:"):
            path = os.path.join(MISTRAL_DATA, spec.removeprefix("mistral:"))
            _tokenizers[spec] = MistralTokenizer(MistralCommonBackend(tokenizer_path=path))
        else:
            _tokenizers[spec] = AutoTokenizer.from_pretrained(spec)
    return _tokenizers[spec]


def parse(case: dict) -> dict:
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "-"}], tools=case["tools"])
    parser = ToolParserManager.get_tool_parser(case["parser"])(tokenizer(case["tokenizer"]), request.tools)
    found = parser.extract_tool_calls(case["text"], request)
    return {"tools_called": found.tools_called, "content": found.content,
            "calls": [[c.function.name, c.function.arguments] for c in found.tool_calls]}


def mistral_turn(case: dict) -> str:
    tok = tokenizer(f"mistral:{case['tokenizer']}")
    calls = [ToolCall(id=f"call{k:05d}", function=FunctionCall(name=c["name"], arguments=json.dumps(c["arguments"])))
             for k, c in enumerate(case["calls"])]
    tools = [Tool(function=Function(name=t["function"]["name"], description=t["function"].get("description", ""),
                                    parameters=t["function"]["parameters"])) for t in case["tools"]]
    messages = [UserMessage(content="Please do it."), AssistantMessage(content=case.get("content"), tool_calls=calls),
                *[ToolMessage(content="done", tool_call_id=c.id) for c in calls], UserMessage(content="Thanks.")]
    ids = tok.mistral.encode_chat_completion(MistralRequest(messages=messages, tools=tools)).tokens
    start = ids.index(tok.get_vocab()["[TOOL_CALLS]"])
    end = ids.index(tok.eos_token_id, start)
    # the text vLLM's incremental detokenizer gives (decode() leaves SentencePiece's "▁" in, after a special token)
    return tok.convert_tokens_to_string(tok.convert_ids_to_tokens(ids[start:end], skip_special_tokens=False))


def main() -> None:
    logging.disable(logging.WARNING)
    request = json.load(sys.stdin)
    answer = {"parse": [parse(c) for c in request.get("parse", [])],
              "mistral": [mistral_turn(c) for c in request.get("mistral", [])]}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
