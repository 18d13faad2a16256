"""tracerl.contracts: each inter-stage file round-trips through its model, and a file that does not
fit is one line naming it (exit code 2 from the CLI)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # contract_cases (pytest runs with --import-mode=importlib)

from contract_cases import samples as contract_samples

from tracerl.cli import main
from tracerl.contracts import (
    Capability, CapabilityResult, Contract, EnvIndex, MetricsRow, default_rubric, metrics_text, read_metrics,
)
from tracerl.core.errors import InputError


@pytest.fixture(scope="module")
def samples() -> dict[str, Contract]:
    return contract_samples()


NAMES = ["capabilities.json", "envs/index.json", "envs/tool_call_precision/env.json",
         "envs/tool_call_precision/target.json", "envs/tool_call_precision/checks.json",
         "envs/tool_call_precision/calibration.json", "adapters/tool_call_precision/train_config.json", "gate_data/summary.json",
         "composed/composition.json", "eval/adapter-tool_call_precision.json", "curve/curve.json",
         "baselines/gepa/result.json", "report/report.json"]


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(samples, tmp_path, name):
    doc = samples[name]
    path = tmp_path / name
    doc.write(path)
    again = type(doc).read(path)
    assert again == doc
    again.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()  # same content, same bytes
    assert not list(path.parent.glob(".*.tmp"))  # written by rename, no temporary left


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("damage, message", [
    (lambda d, required: {**d, "unknown_field": 1}, "field 'unknown_field': Extra inputs are not permitted"),
    (lambda d, required: {k: v for k, v in d.items() if k != required[0]}, "missing field"),
    (lambda d, required: [d], "expected a JSON object"),
], ids=["extra", "missing", "not-an-object"])
def test_a_file_that_does_not_fit_is_one_line_naming_it(samples, tmp_path, name, damage, message):
    doc = samples[name]
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    required = [k for k, f in type(doc).model_fields.items() if f.is_required()]
    path.write_text(json.dumps(damage(doc.model_dump(mode="json"), required)))
    with pytest.raises(InputError) as err:
        type(doc).read(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "index.json"
    bad.write_text('{"target": "airline",\n oops')
    with pytest.raises(InputError, match=rf"^{bad}:2: not valid JSON"):
        EnvIndex.read(bad)
    with pytest.raises(InputError, match=rf"^{tmp_path / 'none.json'}: no such file$"):
        EnvIndex.read(tmp_path / "none.json")


def test_the_cli_turns_a_bad_contract_file_into_exit_2(tmp_path, capsys):
    caps = tmp_path / "capabilities.json"
    caps.write_text(json.dumps({"capabilities": [{"name": "x", "selected": True}]}))
    assert main(["synthesize", "--capabilities", str(caps), "--target", "airline", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{caps}: missing field 'params'" in err


def test_metrics_rows_round_trip_as_jsonl(tmp_path):
    rows = [{"step": 0, "rollouts_used": 0, "eval_success": 0.5},
            {"step": 1, "rollouts_used": 8, "reward_mean": 0.25, "loss": None, "seconds": 1.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text(metrics_text(rows))
    assert [r.model_dump(exclude_unset=True) for r in read_metrics(path)] == rows
    assert read_metrics(path)[1] == MetricsRow(step=1, rollouts_used=8, reward_mean=0.25, seconds=1.5)
    assert read_metrics(tmp_path / "none.jsonl") == []  # not written yet
    path.write_text(metrics_text(rows) + '{"step": 2, "rollouts_used": 16, "rollouts": 16}\n')
    with pytest.raises(InputError, match=rf"^{path}:3: field 'rollouts': Extra inputs are not permitted$"):
        read_metrics(path)


def test_one_capability_model_from_selection_to_composition():
    """A capability known by name and description gets the generic rubric; a selection row is a
    Capability, and its definition is what composition and synthesis use."""
    cap = Capability(name="look_before_acting", description="Read first.")
    assert cap.rubric == default_rubric("Read first.") and cap.source == "builtin"
    with pytest.raises(ValueError, match="not snake_case"):
        Capability(name="Look-Before")
    assert issubclass(CapabilityResult, Capability)


def test_env_digest_is_the_content_of_the_files_that_define_the_environment(tmp_path):
    import hashlib
    import shutil

    from tracerl.contracts import CheckReport, EnvSpec
    from tracerl.envs.synthetic.envdir import env_digest, write_env_dir
    from tracerl.synthesis.target import load_target

    env = write_env_dir(tmp_path / "a" / "cap", EnvSpec(capability="cap", template="cap", target="airline"),
                        load_target("airline"), checks=CheckReport(checks=[]))
    by_hand = hashlib.sha256()
    for name in ("env.json", "target.json"):
        by_hand.update(name.encode() + b"\0" + hashlib.sha256((env / name).read_bytes()).digest())
    assert env_digest(env) == by_hand.hexdigest()
    moved = shutil.copytree(env, tmp_path / "b" / "elsewhere")
    (moved / "checks.json").write_text('{"checks": []}\n')  # a report, not the environment
    (moved / "calibration.json").write_text("{}")
    assert env_digest(moved) == env_digest(env)
    EnvSpec.read(moved / "env.json").model_copy(update={"difficulty": 3}).write(moved / "env.json")
    assert env_digest(moved) != env_digest(env)
    with pytest.raises(ValueError, match="exactly one of 'template' and 'module'"):
        EnvSpec(capability="cap", target="airline")
