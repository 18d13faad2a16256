"""Grade a repository state as SWE-bench does: run the FAIL_TO_PASS and PASS_TO_PASS tests with pytest.

The agent's files are taken as they are, except that the test files the task's tests live in are
put back as the task has them and the hidden tests are added (SWE-bench applies its test patch over
the model's patch the same way), so editing or deleting a test changes nothing. pytest runs in the
sandbox (`tracerl.envs.code.sandbox.run_pytest`); a test passes iff pytest's short summary (`-rA`) reports it
PASSED — a collection error, a time-out or a missing test is a failure. The task is *resolved*
iff every FAIL_TO_PASS and every PASS_TO_PASS test passes.

Results are cached by the content of the files graded (an LRU of `CACHE_SIZE` entries), so the
rollouts of a GRPO group that end in the same repository run pytest once.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from tracerl.envs.code.sandbox import ShellLimits, run_pytest

CACHE_SIZE = 4096
PYTEST_ARGS = ["-q", "-rA", "-p", "no:cacheprovider", "--no-header"]
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED) (\S+)", re.MULTILINE)


@dataclass
class Grade:
    fail_to_pass: dict[str, bool]
    pass_to_pass: dict[str, bool]
    output: str = field(default="", repr=False)

    @property
    def resolved(self) -> bool:
        return all(self.fail_to_pass.values()) and all(self.pass_to_pass.values())

    def breakdown(self) -> dict[str, float]:
        """Shares of FAIL_TO_PASS and PASS_TO_PASS tests that pass (1.0 for an empty list)."""
        share = lambda d: sum(d.values()) / len(d) if d else 1.0  # noqa: E731
        return {"FAIL_TO_PASS": share(self.fail_to_pass), "PASS_TO_PASS": share(self.pass_to_pass)}


def passed_tests(output: str) -> set[str]:
    """The test ids pytest's `-rA` summary reports PASSED."""
    return {m.group(2) for m in _SUMMARY.finditer(output) if m.group(1) == "PASSED"}


_cache: OrderedDict[str, Grade] = OrderedDict()
_lock = threading.Lock()


def grade(files: dict[str, str], original_tests: dict[str, str], hidden_tests: dict[str, str],
          fail_to_pass: list[str], pass_to_pass: list[str], limits: ShellLimits = ShellLimits()) -> Grade:
    """Run the task's tests on `files` (see the module docstring)."""
    graded = {**files, **original_tests, **hidden_tests}
    key = hashlib.sha256(json.dumps([sorted(graded.items()), fail_to_pass, pass_to_pass]).encode()).hexdigest()
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    test_files = sorted({t.split("::")[0] for t in fail_to_pass + pass_to_pass})
    result = run_pytest(graded, PYTEST_ARGS + test_files, limits)
    passed = passed_tests(result.output)
    out = Grade({t: t in passed for t in fail_to_pass}, {t: t in passed for t in pass_to_pass}, result.output)
    with _lock:
        _cache[key] = out
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return out
