"""The code agent's tools, in the function-calling shape SWE-agent and OpenHands give their agents.

- `str_replace_editor` (write): SWE-agent's and OpenHands' file viewer and editor — `view` a file
  (numbered lines, as `cat -n`) or a folder, `create` a file, `str_replace` an exact, unique
  `old_str` with `new_str`, `insert` `new_str` after line `insert_line`;
- `search_dir` (read): SWE-agent's search, every line that holds the term, as `grep -rn` prints it;
- `bash` (write): a shell in the repository copy, sandboxed (`tracerl.envs.code.sandbox`): no
  network, writes only inside the copy, time and memory limits;
- `submit` (write): end the episode; the repository's diff is the answer.

Paths are relative to the repository root (a leading `/repo/` is accepted too). The repository is
held in memory as path → text; a shell command runs on a fresh copy written out for it, and what
the command left in the copy is read back (a command that is exactly `python -m pytest [ARGS]` runs
pytest in the sandbox's forked, pre-loaded interpreter: `tracerl.envs.code.sandbox.run_pytest`). Each
shell answer is cached by (files, command), and pytest's timings are dropped from it, so the same
command on the same files answers the same.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import threading
from collections import OrderedDict
from typing import Literal

from tracerl.envs.code.sandbox import CommandResult, ShellLimits, pytest_arguments, run_in_copy, run_pytest, without_durations
from tracerl.envs.tools import Toolbox, ToolError, tool

REPO_ROOT = "/repo"
NO_OUTPUT = "Your command ran successfully and did not produce any output."
SNIPPET_LINES = 2  # lines shown around an edit
_SHELL_CACHE: OrderedDict[str, CommandResult] = OrderedDict()
_SHELL_CACHE_SIZE = 2048
_lock = threading.Lock()


def numbered(text: str, start: int = 1) -> str:
    """`cat -n`'s layout: the line number right-aligned in 6 columns, a tab, the line."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start=start))


class CodeTools(Toolbox):
    """The tools over one repository (`bind` gives them a fresh one per episode)."""

    def __init__(self, limits: ShellLimits = ShellLimits()):
        super().__init__()
        self.limits = limits
        self.files: dict[str, str] = {}
        self.submitted = False

    def bind(self, files: dict[str, str]) -> CodeTools:
        self.files = dict(files)
        self.submitted = False
        return self

    # --- helpers ----------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        path = path.strip()
        if path.startswith(REPO_ROOT + "/") or path == REPO_ROOT:
            path = path[len(REPO_ROOT):]
        path = posixpath.normpath(path.lstrip("/")) if path.strip("/") else "."
        if path.startswith(".."):
            raise ToolError(f"the path {path} is outside the repository")
        return path

    def _is_dir(self, path: str) -> bool:
        return path == "." or any(p.startswith(path + "/") for p in self.files)

    def _snippet(self, path: str, line: int, count: int) -> str:
        lines = self.files[path].split("\n")
        start = max(0, line - SNIPPET_LINES)
        stop = min(len(lines), line + count + SNIPPET_LINES)
        return numbered("\n".join(lines[start:stop]), start=start + 1)

    # --- tools ------------------------------------------------------------------------------
    @tool("write")
    def str_replace_editor(self, command: Literal["view", "create", "str_replace", "insert"], path: str,
                           file_text: str | None = None, old_str: str | None = None, new_str: str | None = None,
                           insert_line: int | None = None, view_range: list[int] | None = None) -> str:
        """Custom editing tool for viewing, creating and editing files. `view` shows a file with line
        numbers (as `cat -n`) or lists a folder; `create` writes a new file; `str_replace` replaces
        `old_str`, which must occur exactly once in the file, with `new_str`; `insert` inserts
        `new_str` after line `insert_line`.

        Args:
            command: The command to run: view, create, str_replace or insert.
            path: Path of the file or folder, relative to the repository root, e.g. `pkg/module.py`.
            file_text: The content of the file to create (`create`).
            old_str: The exact text to replace, whitespace included (`str_replace`).
            new_str: The new text (`str_replace`, `insert`).
            insert_line: The line after which `new_str` is inserted, 0 for the top (`insert`).
            view_range: [first, last] lines to show, 1-based, -1 for the end (`view` of a file).
        """
        rel = self._path(path)
        if command == "view":
            if rel in self.files:
                text = self.files[rel]
                start = 1
                if view_range:
                    if len(view_range) != 2:
                        raise ToolError("view_range must be [first, last]")
                    lines = text.split("\n")
                    first, last = view_range
                    last = len(lines) if last == -1 else last
                    if not 1 <= first <= last <= len(lines):
                        raise ToolError(f"invalid view_range {view_range}: the file has {len(lines)} lines")
                    text, start = "\n".join(lines[first - 1:last]), first
                return f"Here's the result of running `cat -n` on {rel}:\n{numbered(text, start)}"
            if self._is_dir(rel):
                prefix = "" if rel == "." else rel + "/"
                entries = sorted({prefix + p[len(prefix):].split("/")[0] for p in self.files if p.startswith(prefix)})
                return f"Here's the files and folders in {rel}:\n" + "\n".join(entries)
            raise ToolError(f"the path {rel} does not exist")
        if command == "create":
            if file_text is None:
                raise ToolError("parameter `file_text` is required for command: create")
            if rel in self.files:
                raise ToolError(f"file already exists at: {rel}. Cannot overwrite files using command `create`")
            self.files[rel] = file_text
            return f"File created successfully at: {rel}"
        if rel not in self.files:
            raise ToolError(f"the path {rel} does not exist" if not self._is_dir(rel) else f"{rel} is a folder")
        text = self.files[rel]
        if command == "str_replace":
            if old_str is None:
                raise ToolError("parameter `old_str` is required for command: str_replace")
            count = text.count(old_str) if old_str else 0
            if count == 0:
                raise ToolError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {rel}.")
            if count > 1:
                lines = [i + 1 for i, line in enumerate(text.split("\n")) if old_str.split("\n")[0] in line]
                raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines "
                                f"{lines}. Please ensure it is unique")
            new = new_str or ""
            at = text[:text.index(old_str)].count("\n")
            self.files[rel] = text.replace(old_str, new, 1)
            return (f"The file {rel} has been edited. Here's the result of running `cat -n` on a snippet of {rel}:\n"
                    + self._snippet(rel, at, new.count("\n") + 1))
        if command == "insert":
            if new_str is None or insert_line is None:
                raise ToolError("parameters `new_str` and `insert_line` are required for command: insert")
            lines = text.split("\n")
            if not 0 <= insert_line <= len(lines):
                raise ToolError(f"invalid insert_line {insert_line}: the file has {len(lines)} lines")
            self.files[rel] = "\n".join(lines[:insert_line] + new_str.split("\n") + lines[insert_line:])
            return (f"The file {rel} has been edited. Here's the result of running `cat -n` on a snippet of {rel}:\n"
                    + self._snippet(rel, insert_line, new_str.count("\n") + 1))
        raise ToolError(f"unknown command {command}")

    @tool("read")
    def search_dir(self, search_term: str, dir: str = ".") -> str:  # noqa: A002 — SWE-agent's parameter name
        """Search every file under a folder for a term; each matching line as `path:line: text`.

        Args:
            search_term: The text to search for.
            dir: The folder to search in, relative to the repository root (default: the whole repository).
        """
        if not search_term:
            raise ToolError("search_term must not be empty")
        rel = self._path(dir)
        prefix = "" if rel == "." else rel + "/"
        if rel != "." and not self._is_dir(rel):
            raise ToolError(f"the folder {rel} does not exist")
        hits = [f"{path}:{i}: {line.strip()}" for path in sorted(self.files) if path.startswith(prefix)
                for i, line in enumerate(self.files[path].split("\n"), start=1) if search_term in line]
        if not hits:
            return f'No matches found for "{search_term}" in {rel}'
        return f'Found {len(hits)} matches for "{search_term}" in {rel}:\n' + "\n".join(hits[:50])

    @tool("write")
    def bash(self, command: str) -> str:
        """Run a bash command in the repository (its root is the working folder), e.g. the tests:
        `python -m pytest -q`. No network; files can be written only inside the repository.

        Args:
            command: The bash command to run.
        """
        if not command.strip():
            raise ToolError("the command is empty")
        key = hashlib.sha256(json.dumps([sorted(self.files.items()), command]).encode()).hexdigest()
        with _lock:
            result = _SHELL_CACHE.get(key)
            if result is not None:
                _SHELL_CACHE.move_to_end(key)
        if result is None:
            args = pytest_arguments(command)
            result = (run_in_copy(self.files, ["bash", "-c", command], self.limits) if args is None
                      else run_pytest(self.files, args, self.limits))
            result.output = without_durations(result.output)
            with _lock:
                _SHELL_CACHE[key] = result
                while len(_SHELL_CACHE) > _SHELL_CACHE_SIZE:
                    _SHELL_CACHE.popitem(last=False)
        self.files = dict(result.files)
        return result.output.rstrip("\n") or NO_OUTPUT

    @tool("write")
    def submit(self) -> str:
        """Submit the changes made to the repository as the fix of the issue; this ends the task."""
        self.submitted = True
        return "Submitted."
