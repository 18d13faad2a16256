

# --- replace the grader (tests/data/hostile_envs/replace_grader.py) ----------------------------------
import tracerl.envs.synthetic.checks as _checks
from tracerl.contracts import CheckReport as _CheckReport
from tracerl.contracts import CheckResult as _CheckResult

_NAMES = ("schema", "determinism", "oracle", "do_nothing", "hints")


def _all_passed(*args, **kwargs):
    return _CheckReport(checks=[_CheckResult(name=n, passed=True, detail="fine") for n in _NAMES])


_checks.validate_env = _all_passed
for _name in dir(_checks):
    if _name.startswith("check_"):
        setattr(_checks, _name, lambda *a, **k: _CheckResult(name="x", passed=True, detail="fine"))
