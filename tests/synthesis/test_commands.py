"""`tracerl synthesize` / `tracerl calibrate` end to end, and their one-line errors for bad input."""

import json

import pytest

from contract_cases import capabilities_file

from tracerl.cli import main
from tracerl.contracts import EnvIndex
from tracerl.core.io import read_json, write_json
from tracerl.envs.synthetic.checks import validate_env
from tracerl.envs.synthetic.envdir import load_env_dir, load_env_spec, load_target_json

BUILTIN = ["precondition_verification", "multi_step_completion", "structured_data_reasoning", "tool_call_precision"]


def _capabilities(path, names, extra=()):
    return capabilities_file(path, names, list(extra))


@pytest.mark.parametrize("which", ["airline", "retail"])
def test_synthesize_templates_without_calibration(which, request, tmp_path, capsys):
    target = request.getfixturevalue(which)
    caps = _capabilities(tmp_path / "caps.json", BUILTIN, extra=["tone_and_empathy"])
    out = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", target.source, "--out", str(out),
                 "--no-calibrate", "--json", "--hint-fraction", "0.5"]) == 0
    printed = EnvIndex.model_validate(json.loads(capsys.readouterr().out))
    assert [r.capability for r in printed.environments] == BUILTIN and printed.built() == BUILTIN
    for name in BUILTIN:
        spec = load_env_spec(out / name)
        assert (spec.source, spec.template, spec.target, spec.difficulty) == ("template", name, target.name, 1)
        assert spec.hint_fraction == 0.5
        assert load_target_json(out / name).tools == target.tools
        report = validate_env(load_env_dir(out / name), target.tools, seeds=range(3))
        assert report.passed
        assert not (out / name / "calibration.json").exists()
    assert not (out / "tone_and_empathy").exists()
    index = EnvIndex.read(out / "index.json")
    assert index == printed and (index.target, index.generator) == (target.name, "template")
    assert [r.environment for r in index.environments] == BUILTIN and all(r.calibration is None for r in index.environments)


def test_synthesize_reports_a_capability_it_cannot_build(retail, tmp_path, capsys):
    caps = _capabilities(tmp_path / "caps.json", ["tool_call_precision", "error_recovery"])
    code = main(["synthesize", "--capabilities", str(caps), "--target", retail.source, "--out", str(tmp_path / "o"),
                 "--no-calibrate"])
    assert code == 1
    out = capsys.readouterr().out
    assert "error_recovery: no built-in template for it and no analysis model configured" in out
    assert (tmp_path / "o" / "tool_call_precision" / "env.json").exists()
    assert not (tmp_path / "o" / "error_recovery").exists()


def test_synthesize_and_calibrate_with_a_scripted_base_policy(retail, tmp_path, capsys):
    caps = _capabilities(tmp_path / "caps.json", ["multi_step_completion"])
    out = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", retail.source, "--out", str(out),
                 "--base", "scripted:0.8", "--seeds", "10", "--group-size", "4", "--max-rounds", "2"]) == 0
    saved = read_json(out / "multi_step_completion" / "calibration.json")
    assert saved["policy"] == "scripted:0.8" and saved["group_size"] == 4 and len(saved["seeds"]) == 10
    assert saved["settings"]["temperature"] == 0.7
    (record,) = EnvIndex.read(out / "index.json").environments
    assert record.calibration.difficulty == saved["difficulty"]
    assert record.calibration.success_rate == saved["stats"]["success_rate"]
    assert "pass@1" in capsys.readouterr().out
    # calibrate again on its own, with other bands
    bands = tmp_path / "bands.json"
    write_json(bands, {"success_rate": [0.0, 1.0], "mean_reward": [0.0, 1.0], "max_all_success": 1.0,
                       "max_all_zero": 1.0, "max_constant": 1.0, "min_informative": 0.0, "min_reward_std": 0.0})
    assert main(["calibrate", str(out / "multi_step_completion"), "--base", "scripted:1.0", "--seeds", "3",
                 "--group-size", "2", "--bands", str(bands), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accepted"] and result["stats"]["success_rate"] == 1.0 and len(result["rounds"]) == 1


def test_bad_inputs_exit_2_with_one_line(retail, tmp_path, capsys):
    caps = _capabilities(tmp_path / "caps.json", ["tool_call_precision"])
    none = _capabilities(tmp_path / "none.json", [], extra=["tone_and_empathy"])
    broken = tmp_path / "broken.json"
    broken.write_text('{"capabilities": [\n oops')
    renamed = tmp_path / "renamed.json"  # a field under a name capabilities.json does not have
    doc = read_json(caps)
    doc["capabilities"][0]["cov_ci"] = doc["capabilities"][0].pop("cov_ci95")
    write_json(renamed, doc)
    bands = tmp_path / "bands.json"
    write_json(bands, {"min_std": 0.1})
    out = str(tmp_path / "o")
    reads_only = tmp_path / "reads_only" / "tools.json"
    reads_only.parent.mkdir()
    write_json(reads_only, [{"type": "function", "x-tool-type": "read", "function": {"name": "get_thing",
               "parameters": {"type": "object", "properties": {"thing_id": {"type": "string"}}, "required": ["thing_id"]}}}])
    cases = [
        (["synthesize", "--capabilities", str(caps), "--target", str(reads_only), "--out", out],
         "no read tool shares an id parameter with a write tool"),
        (["synthesize", "--capabilities", str(tmp_path / "missing.json"), "--target", retail.source, "--out", out],
         "missing.json: no such file"),
        (["synthesize", "--capabilities", str(broken), "--target", retail.source, "--out", out], "broken.json:2: not valid JSON"),
        (["synthesize", "--capabilities", str(none), "--target", retail.source, "--out", out], "no capability is selected"),
        (["synthesize", "--capabilities", str(renamed), "--target", retail.source, "--out", out],
         "renamed.json: missing field 'capabilities.0.cov_ci95' (and 1 more)"),
        (["synthesize", "--capabilities", str(caps), "--target", str(tmp_path / "x.json"), "--out", out],
         "x.json: no such file (the target is an environment or a path to a tools.json)"),
        (["synthesize", "--capabilities", str(caps), "--target", retail.source, "--out", out, "--generator", "magic"],
         "field 'generator': Input should be 'template' or 'llm'"),
        (["calibrate", str(tmp_path / "nowhere"), "--base", "scripted:0.5"], "env.json: no such file"),
        (["calibrate", str(tmp_path), "--base", "scripted:0.5", "--bands", str(bands)], "env.json: no such file"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_calibrate_rejects_bad_bands(retail, tmp_path, capsys):
    caps = _capabilities(tmp_path / "caps.json", ["tool_call_precision"])
    out = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", retail.source, "--out", str(out),
                 "--no-calibrate"]) == 0
    capsys.readouterr()
    bands = tmp_path / "bands.json"
    write_json(bands, {"min_std": 0.1})
    assert main(["calibrate", str(out / "tool_call_precision"), "--base", "scripted:0.5", "--bands", str(bands)]) == 2
    assert "bands.json: field 'min_std': Extra inputs are not permitted" in capsys.readouterr().err


def test_the_command_and_the_pipeline_synthesize_alike(tmp_path, capsys):
    """One function (`run_synthesize`): the same capabilities and settings give the same environment
    directories and envs/index.json from `tracerl synthesize` and from the pipeline's synthesize stage."""
    from tracerl.config import RunConfig
    from tracerl.pipeline import SECTIONS, Pipeline
    from tracerl.stages import View

    ws = tmp_path / "ws"
    caps = _capabilities(ws / "capabilities.json", BUILTIN[:2])
    config = RunConfig.model_validate({"synthesize": {"calibrate": False, "hint_fraction": 0.5, "difficulty": 2}})
    Pipeline(config, ws).stage_fns.synthesize(View(config, SECTIONS["synthesize"]))
    out = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", "airline", "--out", str(out), "--no-calibrate",
                 "--hint-fraction", "0.5", "--difficulty", "2"]) == 0
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ws / "envs") for p in (ws / "envs").rglob("*") if p.is_file())
    assert len(files) > 2 and all((out / f).read_bytes() == (ws / "envs" / f).read_bytes() for f in files)
    assert load_env_spec(out / BUILTIN[0]).hint_fraction == 0.5
