"""Text that untrusted code produced (an LLM-written environment module's exceptions, tool results,
hints), made fit to show a user or send back to the analysis model: printable, bounded in length,
and with secrets taken out.

`scrub` replaces, with `[redacted]`:

- the value of every environment variable of this process whose name says it is a secret (…KEY…,
  …TOKEN…, …SECRET…, …PASSWORD…, …CREDENTIAL…, …AUTH…), and any `extra` strings given;
- PEM blocks (`-----BEGIN … PRIVATE KEY-----` …), SSH key lines, crypt(3) hashes as /etc/shadow holds
  them, API tokens of the usual shapes (`sk-…`, `ghp_…`, `AKIA…`, `xox?-…`);
- opaque runs of letters, digits and `+/=_-` with a `/`-separated part of 20 or more characters
  holding at least 4 digits and 4 letters and at most 2 of `_-` (hex digests, base64 keys; not
  paths or snake_case names).

Confinement (`tracerl.envs.synthetic.sandbox`) keeps generated code from reading anything outside its
folder; scrubbing is the second line, for where the user opted out of confinement.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
MIN_SECRET_LENGTH = 6  # an environment variable's value shorter than this is not taken out
_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.DOTALL),
    re.compile(r"\b(?:ssh-(?:rsa|ed25519|dss)|ecdsa-sha2-\S+|sk-ssh-\S+)\s+[A-Za-z0-9+/=]{16,}"),
    re.compile(r"\$(?:1|2[abxy]?|5|6|y|gy|7|sha1|md5)\$[^\s:]{4,}"),
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{12,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abpr]-[A-Za-z0-9\-]{10,}"),
]
_OPAQUE = re.compile(r"[A-Za-z0-9+/=_\-]{20,}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """The values of the environment variables whose names say they are secrets, longest first."""
    environ = os.environ if environ is None else environ
    found = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(found, key=len, reverse=True)


def _opaque(match: re.Match) -> str:
    token = match.group(0)
    for part in token.split("/"):
        digits = sum(c.isdigit() for c in part)
        letters = sum(c.isalpha() for c in part)
        if len(part) >= 20 and digits >= 4 and letters >= 4 and part.count("_") + part.count("-") <= 2:
            return REDACTED
    return token


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with secrets replaced by `[redacted]`, escape sequences and control characters removed."""
    text = _ANSI.sub("", str(text))
    text = _CONTROL.sub("", text)
    for value in [*sorted((e for e in extra if e), key=len, reverse=True), *secret_values()]:
        text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    return _OPAQUE.sub(_opaque, text)


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def untrusted_text(text: str, limit: int = 2000, *, one_line: bool = False) -> str:
    """`scrub` then `bounded`; with `one_line`, line breaks become spaces."""
    text = scrub(text)
    if one_line:
        text = " ".join(text.split())
    return bounded(text, limit)
