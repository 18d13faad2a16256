"""Every `tracerl` command the README shows exists, and every option it uses is one of that command's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import _register_commands, app

README = Path(__file__).parents[1] / "README.md"


def readme_commands() -> list[str]:
    """The `tracerl …` lines of the README's code blocks (continuations joined, comments dropped)."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.DOTALL)
    lines = []
    for block in blocks:
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
                part = re.sub(r"^(\S*/)?(\.venv/bin/)?(?=tracerl\b)", "", part.strip())
                if part.startswith("tracerl ") or part == "tracerl":
                    lines.append(part)
    return lines


def help_text(args: list[str]) -> str:
    _register_commands()
    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, f"`tracerl {' '.join(args)} --help` failed: {result.output}"
    return result.output


COMMANDS = readme_commands()


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("line", COMMANDS)
def test_a_readme_command_and_its_options_exist(line):
    words = shlex.split(line.replace("…", "").replace("[", " ").replace("]", " ").replace("|", " "))[1:]
    command = [w for w in words[:1] if not w.startswith("-")]
    text = help_text(command)
    for option in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), f"`tracerl {' '.join(command)}` has no {option}"
