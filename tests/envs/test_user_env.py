"""A user's own environment, named only as `package.module:factory` or installed as an entry point of the
group `tracerl.envs`: listed by `tracerl envs`, exported by `tracerl tools`, synthesized from with its policy,
and run through `tracerl run` — the example domain of examples/library, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tracerl
from tracerl.cli import main
from tracerl.core.tools import load_tools_json
from tracerl.envs.registry import make_env
from tracerl.envs.synthetic.envdir import load_env_dir
from tracerl.synthesis.target import load_target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "library"
SPEC = "library_env:make_env"


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's folder on the Python path, as `PYTHONPATH=examples/library` puts it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return EXAMPLE


def installed(site: Path) -> Path:
    """A site folder holding the example's distribution metadata with its entry point, as `pip install
    ./examples/library` writes it (importlib.metadata reads the same files)."""
    info = site / "tracerl_library_example-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tracerl-library-example\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text('[tracerl.envs]\nlibrary = library_env:make_env\n')
    return site


def test_a_factory_spec_makes_the_environment(on_path: Path) -> None:
    env = make_env(SPEC, split="train")
    messages, info = env.reset(seed=3)
    assert messages[0].content.startswith("# Library agent policy") and info["task_id"] == "library-3"
    assert {t.name: t.kind for t in env.tools} == {"get_loan_details": "read", "get_user_details": "read",
                                                   "renew_loan": "write", "return_loan": "write",
                                                   "transfer_to_librarian": "generic"}
    assert env.task_seeds(2, 5) == [5, 6] and make_env(SPEC, split="test").task_seeds(1) == [1000]


@pytest.mark.parametrize("spec, expected", [
    ("no_such_module:make_env", "environment 'no_such_module:make_env': cannot import module 'no_such_module'"),
    ("library_env:nothing", "environment 'library_env:nothing': module 'library_env' has no 'nothing'"),
    ("library_env:POLICY", "environment 'library_env:POLICY': 'library_env:POLICY' is not callable"),
    ("library_env:generate_task", "environment 'library_env:generate_task': TypeError"),
    ("library_env:LibraryTools", "the factory returned LibraryTools, not a tracerl.envs.base.Env"),
    ("libary", "unknown environment 'libary' (known: airline, code, toolsandbox, tau2:<domain>, or package.module:factory)"),
])
def test_a_bad_spec_is_one_line_and_exit_2(on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           spec: str, expected: str) -> None:
    out = tmp_path / "tools.json"
    assert main(["tools", "--env", spec, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
    assert not out.exists()


def test_envs_lists_installed_environments(on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs", "--json"]) == 0
    assert "library" not in json.loads(capsys.readouterr().out)
    monkeypatch.syspath_prepend(str(installed(tmp_path / "site")))
    assert main(["envs", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["library"] == "entry point library_env:make_env" and found["airline"].startswith("built in")
    assert make_env("library", split="test").task_seeds(1) == [1000]


def test_tools_exports_what_synthesis_reads_and_the_policy_file_reaches_the_templates(
        on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "library" / "tools.json"
    out.parent.mkdir()
    assert main(["tools", "--env", SPEC, "--out", str(out)]) == 0
    assert "5 tools (2 read, 2 write, 1 generic)" in capsys.readouterr().err
    assert load_tools_json(out) == make_env(SPEC).tools
    bare = load_target(str(out))
    assert bare.title == "# Library agent policy" and bare.rules == () and bare.policy == ""
    policy = tmp_path / "policy.md"
    policy.write_text(make_env(SPEC).reset(seed=0)[0][0].content)
    target = load_target(str(out), policy=policy)
    assert target.title == "# Library agent policy"
    assert target.rules == ("Renew loan: not if the loan is overdue, and not if it has been renewed twice already. "
                            "Otherwise renew it with renew_loan.", "Return loan: always allowed; record it with return_loan.")
    assert target.closing == ("If you cannot do what the member asks, make no change and say that you cannot, and why.",)
    assert target.policy == policy.read_text().strip()
    # a hand-written capability list (names and descriptions) → one environment each, stating the domain's lines
    caps = tmp_path / "caps.yaml"
    caps.write_text("- name: precondition_verification\n  description: Check a loan before renewing it.\n"
                    "- name: multi_step_completion\n  description: Do every request.\n")
    envs = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", str(out), "--policy", str(policy),
                 "--out", str(envs), "--no-calibrate", "--json"]) == 0
    index = json.loads(capsys.readouterr().out)
    assert [(e["capability"], e["status"]) for e in index["environments"]] == [
        ("precondition_verification", "DONE"), ("multi_step_completion", "DONE")]
    prompt = load_env_dir(envs / "multi_step_completion")().reset(seed=0)[0][0].content
    assert prompt.startswith("# Library agent policy\nYou help members of the city library")
    assert "If you cannot do what the member asks" in prompt


def test_the_environments_own_requests_and_rules_reach_the_precondition_template(on_path: Path) -> None:
    """Built from the environment itself (its `user_requests`), half the precondition tasks are the domain's own
    requests under the domain's own rules, stated in its words."""
    target = load_target(SPEC)
    assert target.policy.startswith("# Library agent policy") and len(target.rules) == 2
    assert {e["allowed"] for e in target.request_examples["renew_loan"]} == {True, False}
    from tracerl.envs.synthetic.templates import template_for

    env = template_for("precondition_verification")(target, difficulty=1)
    kinds, prompts = set(), set()
    for seed in range(40):
        messages, info = env.reset(seed=seed)
        kinds.add(info["task_kind"])
        if info["task_kind"].startswith("target-"):
            prompts.add(messages[0].content)
    assert {"target-allowed", "target-forbidden"} <= kinds
    assert all("Renew loan: not if the loan is overdue" in p and "its amount is at most" not in p for p in prompts)


def run_cli(args: list[str], pythonpath: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(Path(tracerl.__file__).parents[1])])}
    return subprocess.run([sys.executable, "-m", "tracerl.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["factory", "entry point"])
def test_tracerl_run_on_the_user_environment(tmp_path: Path, how: str) -> None:
    """The example's config through `tracerl run`, as far as the tiny agent allows: it passes only the requests the
    policy forbids, by doing nothing, so selection finds no capability whose absence explains its failures, and the
    run stops there with one line (exit 2) before any environment, adapter or report is written."""
    config = yaml.safe_load((EXAMPLE / "library.yaml").read_text())
    config["collect"]["tasks"] = 8
    if how == "entry point":
        config["target"]["env"] = "library"
    path = tmp_path / "library.yaml"
    path.write_text(yaml.safe_dump(config))
    paths = [EXAMPLE] + ([installed(tmp_path / "site")] if how == "entry point" else [])
    proc = run_cli(["run", str(path), "-w", str(tmp_path / "ws")], paths, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "capabilities.json: no capability is selected: nothing to synthesize" in last
    rollouts = [json.loads(line) for line in (tmp_path / "ws" / "rollouts" / "base.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rollouts] == [f"library-{s}" for s in range(8)]
    assert (tmp_path / "ws" / "capabilities.json").exists()
    assert not (tmp_path / "ws" / "envs").exists() and not (tmp_path / "ws" / "report").exists()
