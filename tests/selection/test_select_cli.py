"""`tracerl select` end to end with the rules labeller, and the catalogue files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.cli import main
from tracerl.core.errors import InputError
from tracerl.contracts import CapabilitiesFile
from tracerl.selection.catalogue import BUILTIN, load_capabilities

PLANTED = {"multi_step_completion", "tool_call_precision"}


@pytest.fixture
def sample(tau2_data: Path) -> Path:
    return tau2_data / "retail" / "sample_results.json"


def test_builtin_catalogue() -> None:
    names = [c.name for c in BUILTIN]
    for required in ("precondition_verification", "multi_step_completion", "structured_data_reasoning", "tool_call_precision",
                     "error_recovery", "information_communication"):
        assert required in names
    assert sum(c.decoy for c in BUILTIN) >= 2
    assert all(c.rubric.na and c.rubric.present and c.rubric.lacking for c in BUILTIN)


def test_select_on_tau2_sample_picks_exactly_the_planted_capabilities(sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sel"
    assert main(["select", "--rollouts", str(sample), "--out", str(out), "--json", "--bootstrap", "200"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((out / "capabilities.json").read_text())
    assert CapabilitiesFile.read(out / "capabilities.json").model_dump(mode="json") == doc  # written through its contract
    assert doc["params"] == {"rho": 0.1, "delta": 0.2, "k": 8, "n": 10, "bootstrap": 200, "seed": 0}
    assert doc["totals"] == {"trajectories": 114, "failed": 22, "passed": 92}
    assert {c["name"] for c in doc["capabilities"] if c["selected"]} == PLANTED
    assert [c["name"] for c in doc["capabilities"][:2]] == ["multi_step_completion", "tool_call_precision"]  # ranked by mean Δ
    assert "deterministic" in doc["labeler"]["note"]
    by = {c["name"]: c for c in doc["capabilities"]}
    ms = by["multi_step_completion"]
    # 12 dropped-last-write runs among 22 failed; 5 failed need < 2 writes (NA); no passed one lacks it
    assert ms["mean_cov"] == pytest.approx(12 / 22, abs=1e-6) and ms["mean_delta"] == pytest.approx(12 / 17, abs=1e-6)
    assert ms["std_cov"] == 0 and ms["runs_passed"] == 10 and ms["runs_total"] == 10
    assert ms["cov_ci95"][0] <= ms["mean_cov"] <= ms["cov_ci95"][1]
    assert by["tool_call_precision"]["mean_cov"] == pytest.approx(10 / 22, abs=1e-6)
    assert len(ms["example_failed"]) == 3 and all(e["lacking_runs"] == 10 for e in ms["example_failed"])
    assert by["precondition_verification"]["runs_passed"] == 0 and by["structured_data_reasoning"]["runs_passed"] == 0
    for key in ("name", "description", "selected", "mean_cov", "std_cov", "mean_delta", "std_delta", "runs_passed", "runs_total", "example_failed"):
        assert all(key in c for c in doc["capabilities"])
    runs = sorted((out / "labels").iterdir())
    assert [p.name for p in runs] == [f"run_{r:02d}.json" for r in range(10)]
    run3 = json.loads(runs[3].read_text())
    assert run3["run"] == 3 and run3["seed"] == 3 and len(run3["trajectories"]) == 114 and run3["unlabelled"] == 0
    assert run3["trajectories"][0]["labels"]["multi_step_completion"]["label"] in ("NA", "PRESENT", "LACKING")


def test_select_table_and_user_capabilities(sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    caps = tmp_path / "caps.yaml"
    caps.write_text("- name: upsell_skill\n  description: Offers the user insurance when it fits.\n")
    assert main(["select", "--rollouts", str(sample), "--out", str(tmp_path / "s"), "--runs", "2", "--capabilities", str(caps)]) == 0
    out = capsys.readouterr().out
    assert "multi_step_completion" in out and "upsell_skill" in out and "deterministic" in out
    doc = json.loads((tmp_path / "s" / "capabilities.json").read_text())
    upsell = next(c for c in doc["capabilities"] if c["name"] == "upsell_skill")
    assert upsell["source"] == "user" and upsell["unlabelled_pairs"] == 2 * 114 and not upsell["selected"]
    assert doc["unlabelled_pairs"] == 2 * 114 and doc["params"]["k"] == 2


def test_capability_files(tmp_path: Path) -> None:
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"capabilities": [{"name": "date_arithmetic", "description": "Computes dates.",
                                                "rubric": {"na": "a", "present": "b", "lacking": "c"}}]}))
    assert load_capabilities(j)[0].rubric.lacking == "c"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: ok_name\n  description: x\n- name: a: b\n")
    with pytest.raises(InputError, match=r"bad.yaml:3: not valid YAML"):
        load_capabilities(bad)
    camel = tmp_path / "camel.yaml"
    camel.write_text("- name: NotSnake\n  description: x\n")
    with pytest.raises(InputError, match="capability 0: field 'name'.*not snake_case"):
        load_capabilities(camel)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--labeler", "magic"], "field 'labeler': Input should be 'rules' or 'llm'"),
        (["--runs", "3", "--min-runs", "5"], "field 'min_runs': Value error, K = 5 runs to pass, more than the N = 3"),
        (["--labeler", "llm", "--analysis-base-url", "http://127.0.0.1:9/v1"], "needs a model name"),
        (["--labeler", "llm", "--analysis-model", "m"], "needs an endpoint"),
        (["--labeler", "llm", "--analysis-base-url", "http://127.0.0.1:9/v1", "--analysis-model", "m",
          "--analysis-temperature", "0"], "temperature must be > 0"),
        (["--labeler", "llm", "--analysis-base-url", "http://127.0.0.1:9/v1", "--analysis-model", "m",
          "--analysis-timeout", "0"], "analysis settings: field 'timeout'"),
        (["--capabilities", "/nonexistent/caps.yaml"], "caps.yaml: no such file"),
    ],
)
def test_select_bad_input_exits_2_and_writes_nothing(sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, extra: list[str], expected: str) -> None:
    for var in ("OPENAI_BASE_URL", "OPENAI_MODEL", "TRACERL_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "sel"
    assert main(["select", "--rollouts", str(sample), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
    assert not out.exists()


def test_select_on_malformed_rollouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"task_id": "1"}\n')
    assert main(["select", "--rollouts", str(bad), "--out", str(tmp_path / "sel")]) == 2
    assert "r.jsonl:1: missing field 'domain'" in capsys.readouterr().err
    assert not (tmp_path / "sel").exists()


def test_llm_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.models.analysis import AnalysisConfig

    monkeypatch.setenv("OPENAI_BASE_URL", "http://example.invalid/v1")
    monkeypatch.setenv("TRACERL_LLM_MODEL", "qwen3-8b")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = AnalysisConfig().resolved()
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://example.invalid/v1", "qwen3-8b", "EMPTY")
    monkeypatch.setenv("MY_KEY", "sk")
    cfg = AnalysisConfig(model="other", api_key_env="MY_KEY").resolved()
    assert (cfg.model, cfg.api_key) == ("other", "sk")


def test_the_command_and_the_pipeline_select_alike(sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One function (`run_select`): the same rollouts and settings give the same capabilities.json from
    `tracerl select` and from the pipeline's select stage; a user capability named as a built-in replaces it."""
    from tracerl.config import RunConfig
    from tracerl.core.io import write_jsonl
    from tracerl.envs.loading import load_rollouts
    from tracerl.pipeline import SECTIONS, Pipeline
    from tracerl.stages import View

    caps = tmp_path / "caps.yaml"
    caps.write_text("- name: tool_call_precision\n  description: Calls each tool with exactly the right arguments.\n"
                    "- name: upsell_skill\n  description: Offers the user insurance when it fits.\n")
    ws = tmp_path / "ws"
    write_jsonl(ws / "rollouts" / "base.jsonl", load_rollouts(sample))
    config = RunConfig.model_validate({"select": {"bootstrap": 200, "capabilities": str(caps), "max_selected": 1}})
    Pipeline(config, ws).stage_fns.select(View(config, SECTIONS["select"]))
    out = tmp_path / "sel"
    assert main(["select", "--rollouts", str(ws / "rollouts" / "base.jsonl"), "--out", str(out), "--bootstrap", "200",
                 "--capabilities", str(caps), "--max-selected", "1", "--json"]) == 0
    assert (out / "capabilities.json").read_bytes() == (ws / "capabilities.json").read_bytes()
    doc = CapabilitiesFile.read(out / "capabilities.json")
    precision = next(c for c in doc.capabilities if c.name == "tool_call_precision")
    assert precision.description == "Calls each tool with exactly the right arguments."
    assert "upsell_skill" in {c.name for c in doc.capabilities} and len(doc.selected()) == 1
