"""SWE-RL's reward (Wei et al., 2025, "SWE-RL: Advancing LLM Reasoning via Reinforcement Learning on
Open Software Evolution", §2.1), written from the paper's definition:

    R = −1                                             if the answer does not parse as a patch
    R = mean over files f in F_pred ∪ F_gold of  similarity(d_pred(f), d_gold(f))   otherwise

where d(f) is the patch's normalised diff of file f (the empty text when the patch leaves f alone)
and similarity(a, b) = `difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()` = 2·M / (|a| + |b|),
M the characters of the matching blocks. Two empty patches are identical (R = 1).

Normalising a file's diff keeps what it changes and drops how it is written down: the hunks'
context, removed and added lines (' ', '-', '+' and the line after the marker, trailing
whitespace stripped), in order, one per line; not the `diff --git`, `index`, mode or `@@` lines
(so line numbers, timestamps and the a/ b/ prefixes do not count).

A patch parses when every file section has `---` and `+++` headers, every hunk header is
`@@ -start[,count] +start[,count] @@`, every hunk line starts with ' ', '-', '+' or '\\' and each
hunk holds as many old and new lines as its header says. Text before the first file section (a
commit message) is allowed, as `git apply` allows it; a text with no file section at all is not a
patch, but the empty text is (the empty patch: no change).
"""

from __future__ import annotations

import difflib
import re

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The text is not a unified diff."""


def _path(header: str) -> str | None:
    name = header[4:].split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def normalised_diffs(patch: str) -> dict[str, str]:
    """Each file's normalised diff (see the module docstring), by path; raises `PatchError`."""
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: dict[str, list[str]] = {}
    i = 0
    while i < len(lines) and not lines[i].startswith("--- "):
        if lines[i].startswith(("+++ ", "@@")):
            raise PatchError(f"line {i + 1}: '{lines[i][:40]}' before any '--- ' file header")
        i += 1
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            if line.startswith(("diff ", "index ", "new file mode", "deleted file mode", "old mode", "new mode",
                                "similarity index", "rename ", "Binary files")):
                i += 1
                continue
            raise PatchError(f"line {i + 1}: expected a '--- ' file header, got '{line[:40]}'")
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 2}: a '--- ' header without its '+++ ' header")
        path = _path(lines[i + 1]) or _path(line)
        if path is None:
            raise PatchError(f"line {i + 1}: both sides of the file are /dev/null")
        body = files.setdefault(path, [])
        i += 2
        hunks = 0
        while i < len(lines) and lines[i].startswith("@@"):
            match = _HUNK.match(lines[i])
            if match is None:
                raise PatchError(f"line {i + 1}: malformed hunk header '{lines[i][:40]}'")
            old = 1 if match.group(2) is None else int(match.group(2))
            new = 1 if match.group(4) is None else int(match.group(4))
            i += 1
            hunks += 1
            while old > 0 or new > 0:
                if i >= len(lines):
                    raise PatchError(f"line {i}: the hunk ends early ({old} old and {new} new lines missing)")
                text = lines[i]
                marker = text[:1] if text else " "  # an empty line is an empty context line
                if marker == " ":
                    old, new = old - 1, new - 1
                elif marker == "-":
                    old -= 1
                elif marker == "+":
                    new -= 1
                elif marker != "\\":
                    raise PatchError(f"line {i + 1}: a hunk line must start with ' ', '-' or '+', got '{text[:40]}'")
                if old < 0 or new < 0:
                    raise PatchError(f"line {i + 1}: the hunk holds more lines than its header says")
                if marker != "\\":
                    body.append(marker + text[1:].rstrip())
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
        if hunks == 0 and not body:
            raise PatchError(f"line {i}: file {path} has no hunk")
    if not files and patch.strip():
        raise PatchError("no '--- ' / '+++ ' file section in the text")
    return {path: "\n".join(body) for path, body in files.items()}


def similarity(a: str, b: str) -> float:
    """difflib's ratio 2·M / (|a| + |b|), without its junk heuristic; 1.0 for two empty texts."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def patch_similarity(predicted: str, gold: str) -> float:
    """SWE-RL's reward of `predicted` against `gold` (see the module docstring): −1 if `predicted`
    does not parse, else the mean per-file similarity over the union of their files. A `gold` that
    does not parse is an error of the task, raised as `PatchError`."""
    try:
        pred = normalised_diffs(predicted)
    except PatchError:
        return -1.0
    ref = normalised_diffs(gold)
    paths = sorted(set(pred) | set(ref))
    if not paths:
        return 1.0
    return sum(similarity(pred.get(p, ""), ref.get(p, "")) for p in paths) / len(paths)
