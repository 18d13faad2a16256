"""Check an untrusted environment module: its code runs confined, the verdict is reached here.

`run_in_sandbox(module_dir)` starts a `SandboxWorker` (`tracerl.envs.synthetic.sandbox`: a confined
process on a throw-away copy of env.py and target.json), imports the module there, and runs every
requirement check (`tracerl.envs.synthetic.checks.validate_env`) in this process over `SandboxedEnv`
proxies: this process plays the oracle and the do-nothing policy, replays seeds, compares
transcripts and reads the rewards the worker returned. Nothing the module prints or reports about
itself counts, and replacing the checks inside the worker changes nothing.

`run_in_sandbox` never raises for what the module does: every outcome (checks failed, crash,
time-out, memory exhausted, forbidden operation) comes back in a `SandboxResult`, its text scrubbed
and bounded (`tracerl.core.untrusted`). It raises `ConfinementUnavailable` (an `InputError`) where
the kernel cannot confine the module and the user did not opt in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tracerl.contracts import CheckReport
from tracerl.core.io import read_json
from tracerl.core.untrusted import untrusted_text
from tracerl.envs.synthetic.checks import validate_env
from tracerl.envs.synthetic.envdir import MODULE_PY, TARGET_JSON
from tracerl.envs.synthetic.sandbox import (
    GeneratedCodeError,
    SandboxFailure,
    SandboxWorker,
    WorkerLimits,
    network_namespace_available,
)
from tracerl.envs.synthetic.target import Target

__all__ = ["SandboxLimits", "SandboxResult", "network_namespace_available", "run_in_sandbox"]

SUMMARY_CHARS = 4000  # the most of a result's text that is kept (and sent back to the analysis model)


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 60
    memory_bytes: int = 2 << 30  # address space
    wall_seconds: float = 120.0  # the whole check, import included
    file_bytes: int = 16 << 20
    open_files: int = 256
    seeds: int = 20
    difficulty: int = 1

    def worker(self) -> WorkerLimits:
        return WorkerLimits(cpu_seconds=self.cpu_seconds, memory_bytes=self.memory_bytes,
                            call_seconds=self.wall_seconds, file_bytes=self.file_bytes, open_files=self.open_files)


@dataclass
class SandboxResult:
    ok: bool  # every check passed
    error: str | None = None  # why it did not (one line), when not a failed check
    report: CheckReport | None = None
    isolation: list[str] = field(default_factory=list)  # the layers that were active

    def summary(self) -> str:
        if self.ok:
            return "all checks passed"
        if self.report is not None and not self.report.passed:
            return untrusted_text(self.report.failures(), SUMMARY_CHARS)
        return untrusted_text(self.error or "failed", SUMMARY_CHARS)


def run_in_sandbox(module_dir: str | Path, limits: SandboxLimits | None = None) -> SandboxResult:
    """Check the env module in `module_dir` (env.py + target.json): import and play it in a confined
    worker, grade it here."""
    limits = limits or SandboxLimits()
    module_dir = Path(module_dir)
    target = Target.from_json(read_json(module_dir / TARGET_JSON))
    worker = SandboxWorker(module_dir, MODULE_PY, files=(TARGET_JSON,), limits=limits.worker(),
                           deadline=(time.monotonic(), limits.wall_seconds), source=str(module_dir / MODULE_PY))
    try:
        try:
            worker.load()
        except GeneratedCodeError as e:
            return SandboxResult(ok=False, error=f"import failed: {e}", isolation=worker.isolation)
        except SandboxFailure as e:
            return SandboxResult(ok=False, error=str(e), isolation=worker.isolation)
        report = validate_env(worker.factory(limits.difficulty), target.tools, seeds=range(limits.seeds))
        if worker.failure is not None:  # killed during the checks: that, not the checks it broke, is the verdict
            return SandboxResult(ok=False, error=worker.failure, isolation=worker.isolation)
        return SandboxResult(ok=report.passed, report=_scrubbed(report), isolation=worker.isolation)
    finally:
        worker.close()


def _scrubbed(report: CheckReport) -> CheckReport:
    """The report with each detail (built from what the module returned) scrubbed and bounded."""
    checks = [c.model_copy(update={"detail": untrusted_text(c.detail, 1000)}) for c in report.checks]
    return report.model_copy(update={"checks": checks})
