"""A model of your own as a base: which chat templates render a tool-using conversation, and `tracerl import-model`
writing a plain Hugging Face directory with the template given (the GGUF path: tests/pipeline/test_smollm2.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tracerl.cli import main
from tracerl.config import RunConfig
from tracerl.models.chat import ChatFormat
from tracerl.models.local import load_model
from tracerl.models.templates import CHAT_TEMPLATES, CHATML_TEMPLATE, TINY_AGENT_TEMPLATE

# A chat-only template of the common ChatML shape (SmolLM2's has it): every message's content, nothing else.
CHAT_ONLY = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOOLS_BUT_NO_CALLS = CHATML_TEMPLATE.replace("{%- if message.tool_calls %}", "{%- if false %}")
TOOLS_BUT_NO_RESULTS = CHATML_TEMPLATE.replace("{{- content }}\n        {{- '\\n</tool_response>' }}",
                                               "{{- '\\n</tool_response>' }}")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-agent")


def problem(tokenizer, template: str, **options) -> str | None:
    tokenizer.chat_template = template
    return ChatFormat(tokenizer, **options).tool_rendering_problem()


def test_which_templates_render_a_tool_using_conversation(tiny) -> None:
    _, tokenizer = tiny
    original = tokenizer.chat_template
    try:
        for name, template in CHAT_TEMPLATES.items():
            assert problem(tokenizer, template) is None, name
        assert "fails on a tool-calling conversation (UndefinedError" in problem(tokenizer, CHAT_ONLY)
        chat_only_tolerant = CHAT_ONLY.replace("message['content']", "(message['content'] or '')")
        assert problem(tokenizer, chat_only_tolerant) == "the chat template does not render the tools"
        assert TOOLS_BUT_NO_CALLS != CHATML_TEMPLATE and TOOLS_BUT_NO_RESULTS != CHATML_TEMPLATE
        assert problem(tokenizer, TOOLS_BUT_NO_CALLS) == "the chat template does not render an assistant turn's tool calls"
        assert problem(tokenizer, TOOLS_BUT_NO_RESULTS) == "the chat template does not render tool results"
        assert problem(tokenizer, CHATML_TEMPLATE, tool_format="llama3_json") == \
            "the chat template's tool calls do not parse back in the format 'llama3_json'"
    finally:
        tokenizer.chat_template = original
    assert tokenizer.chat_template == TINY_AGENT_TEMPLATE


def test_import_model_writes_the_same_model_with_the_template_given(tiny, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "agent"
    assert main(["import-model", "tiny-agent", "--chat-template", "chatml", "--tool-call-format", "hermes",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().err.startswith(f"wrote {out}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent"]  # no temporary folder left
    model, tokenizer = load_model(out)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert json.loads((out / "tokenizer_config.json").read_text())["tool_call_format"] == "hermes"
    assert ChatFormat(tokenizer).tool_format == "hermes"
    ids = torch.tensor([[5, 17, 99, 300, 2]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny[0](ids).logits)
    template = tmp_path / "mine.jinja"
    template.write_text(TINY_AGENT_TEMPLATE)
    assert main(["import-model", "tiny-agent", "--chat-template", str(template), "--out", str(tmp_path / "own")]) == 0
    assert load_model(tmp_path / "own")[1].chat_template == TINY_AGENT_TEMPLATE


@pytest.mark.parametrize(("args", "message"), [
    (["--chat-template", "nothing.jinja"], "--chat-template: neither a built-in template (chatml, qwen3, tiny-agent) "
                                           "nor a file: nothing.jinja"),
    (["--tool-call-format", "xml"], "--tool-call-format: unknown format 'xml' (known: hermes, qwen3_xml, llama3_json, "
                                    "mistral)"),
    (["--dtype", "int8"], "--dtype: unknown dtype 'int8' (known: float32, bfloat16, float16)"),
    (["--chat-template", "CHAT_ONLY"], "tiny-agent with the template "),
])
def test_bad_imports_are_one_line_exit_2_and_write_nothing(args: list[str], message: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    if "CHAT_ONLY" in args:
        (tmp_path / "chat.jinja").write_text(CHAT_ONLY)
        args = ["--chat-template", str(tmp_path / "chat.jinja")]
        message += f"{tmp_path / 'chat.jinja'}: the chat template fails on a tool-calling conversation"
    out = tmp_path / "out"
    assert main(["import-model", "tiny-agent", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["chat.jinja"] if "chat.jinja" in err else [])


def test_an_occupied_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert main(["import-model", "tiny-agent", "--out", str(tmp_path / "out")]) == 2
    assert f"--out: {tmp_path / 'out'} exists and is not an empty directory" in capsys.readouterr().err


def test_a_gguf_is_no_base_to_train_on() -> None:
    with pytest.raises(ValueError, match="a GGUF file cannot be a base to train on .* tracerl import-model FILE.gguf"):
        RunConfig.model_validate({"model": {"base": "models/smollm2.gguf"}})
