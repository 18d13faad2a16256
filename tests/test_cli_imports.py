"""The commands that load no model start without torch, transformers or peft (each in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracerl

TESTS = Path(__file__).resolve().parent
SAMPLE = TESTS / "data" / "tau2" / "retail" / "sample_results.json"
HEAVY = ("torch", "transformers", "peft")
PROBE = """
import json, sys
from tracerl.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY,)


def run_cli(*args: str) -> dict:
    """Run `tracerl ARGS` in a new interpreter on this checkout's code; its exit code and heavy imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tracerl.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stderr.strip().splitlines()[-1])


def report_workspace(root: Path) -> Path:
    """The complete fake workspace of tests/evaluation/test_report.py."""
    spec = importlib.util.spec_from_file_location("report_cases", TESTS / "evaluation" / "test_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_workspace(root)


@pytest.mark.parametrize("args", [["--help"], ["show", str(SAMPLE)], ["show", "--help"]], ids=["help", "show", "show-help"])
def test_help_and_show_import_no_torch(args):
    assert run_cli(*args) == {"code": 0, "heavy": []}


def test_select_imports_no_torch(tmp_path):
    out = tmp_path / "sel"
    assert run_cli("select", "--rollouts", str(SAMPLE), "--out", str(out), "--runs", "2", "--min-runs", "2",
                   "--bootstrap", "100") == {"code": 0, "heavy": []}
    assert json.loads((out / "capabilities.json").read_text())["totals"]["trajectories"] == 114


def test_report_imports_no_torch(tmp_path):
    ws = report_workspace(tmp_path)
    assert run_cli("report", "--workspace", str(ws)) == {"code": 0, "heavy": []}
    assert (ws / "report" / "index.html").is_file()
