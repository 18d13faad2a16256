"""Caches that never serve a stale result, and say why a stage runs again: every file a stage reads is
in its key (what a composition names by path included, nothing left out by its path), and a rerun
names the config field, the input file or the output behind it."""

import json
import shutil
import sys
from pathlib import Path

from tracerl.cli import main
from tracerl.config import RunConfig
from tracerl.contracts import AdapterRef, Capability, CompositionSpec
from tracerl.core.io import write_json
from tracerl.pipeline import Pipeline
from tracerl.stages import Stage, run_stage, stale_reasons, write_record

sys.path.insert(0, str(Path(__file__).parent))  # test_cache_keys' stand-in workspace (importlib import mode)

TAU2 = Path(__file__).resolve().parents[1] / "data" / "tau2" / "retail"
IMPORTED = """
seed: 0
target: {{results: {results}, tools: {tools}}}
select: {{runs: 1, bootstrap: 20, rho: {rho}}}
synthesize: {{calibrate: false}}
"""


def test_a_rerun_says_which_config_field_and_which_input_changed(tmp_path, capsys):
    config, ws = tmp_path / "run.yaml", tmp_path / "ws"
    config.write_text(IMPORTED.format(results=TAU2 / "sample_results.json", tools=TAU2 / "tools.json", rho=0.1))
    assert main(["run", str(config), "-w", str(ws)]) == 0
    assert "runs again" not in capsys.readouterr().err  # a first run has nothing to explain
    config.write_text(IMPORTED.format(results=TAU2 / "sample_results.json", tools=TAU2 / "tools.json", rho=0.2))
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    captured = capsys.readouterr()
    assert "select runs again: config select.rho: 0.1 → 0.2" in captured.err
    assert "synthesize runs again: input capabilities.json changed" in captured.err
    log = {s["stage"]: s for s in json.loads(captured.out)["stages"]}
    assert not log["collect"]["ran"] and log["collect"]["reasons"] == []
    assert log["select"]["reasons"] == ["config select.rho: 0.1 → 0.2"]
    assert main(["run", str(config), "-w", str(ws), "--force", "collect"]) == 0
    assert "collect runs again: forced (--force)" in capsys.readouterr().err


def composition(folder: Path, adapters: list[str]) -> None:
    caps = [Capability(name=a, description=a) for a in adapters]
    CompositionSpec(model_name="m", mode="router", base="tiny-agent", capabilities=caps, slots=["base", *adapters],
                    adapters=[AdapterRef(name=a, path=f"../adapters/{a}") for a in adapters]).write(folder / "composition.json")


def test_a_composition_is_keyed_by_the_adapters_it_names(tmp_path):
    """The defect: a retrained adapter left composed_router/ unchanged (it names adapters by path), so
    eval:trace_router was skipped and kept the old adapters' result."""
    from test_cache_keys import CAPS, CONFIG, build_workspace

    config = RunConfig.model_validate(CONFIG)
    ws = tmp_path / "ws"
    build_workspace(ws, config)
    pipeline = Pipeline(config, ws)
    for mode in config.compose.modes:
        composition(pipeline.ws.composed(mode), CAPS)
        (pipeline.ws.adapter(CAPS[0]) / "adapter_config.json").write_text("{}")
    stages = {s.name: s for s in pipeline.stages()}
    for stage in stages.values():
        write_record(ws, stage, summary={})
    assert all(stale_reasons(ws, s) == [] for s in stages.values())
    (pipeline.ws.adapter(CAPS[0]) / "adapter_model.safetensors").write_text("retrained")
    stages = {s.name: s for s in Pipeline(config, ws).stages()}
    for variant in ("eval:trace_router", "eval:trace_moe", "curve"):
        assert stale_reasons(ws, stages[variant]) == [f"input adapters/{CAPS[0]}/adapter_model.safetensors changed"]
    assert stale_reasons(ws, stages["eval:base"]) == []


def test_a_composition_naming_an_adapter_outside_the_workspace_is_keyed_by_it(tmp_path):
    from test_cache_keys import CAPS, CONFIG, build_workspace

    config = RunConfig.model_validate(CONFIG)
    ws = tmp_path / "ws"
    build_workspace(ws, config)
    outside = tmp_path / "elsewhere" / "adapters" / "extra"
    outside.mkdir(parents=True)
    (outside / "adapter_model.safetensors").write_text("v1")
    (outside / "adapter_config.json").write_text("{}")
    pipeline = Pipeline(config, ws)
    folder = pipeline.ws.composed("router")
    composition(folder, CAPS)
    spec = CompositionSpec.read(folder / "composition.json")
    spec.adapters.append(AdapterRef(name="extra", path="../../elsewhere/adapters/extra"))
    spec.write(folder / "composition.json")
    stage = next(s for s in pipeline.stages() if s.name == "eval:trace_router")
    assert str(outside / "adapter_model.safetensors") in stage.inputs
    write_record(ws, stage, summary={})
    (outside / "adapter_model.safetensors").write_text("v2")
    assert stale_reasons(ws, stage) == [f"input {outside / 'adapter_model.safetensors'} changed"]


def test_no_file_is_left_out_of_a_key_by_its_path(tmp_path):
    """A workspace under a folder named `checkpoint`, files in a `checkpoint` folder or with a hidden name
    inside an input folder: each is in the key."""
    ws = tmp_path / "checkpoint" / "ws"
    (ws / "data" / "checkpoint").mkdir(parents=True)
    (ws / "rollouts.jsonl").write_text("a\n")
    (ws / "data" / "checkpoint" / "state.json").write_text("1")
    (ws / "data" / ".hidden").write_text("1")
    calls = []

    def stage():
        return Stage("s", lambda: calls.append(1) or write_json(ws / "out.json", {}), inputs=["rollouts.jsonl", "data"],
                     outputs=["out.json"], config={"x": 1})

    assert run_stage(ws, stage())[0]
    for path, reason in [(ws / "rollouts.jsonl", "input rollouts.jsonl changed"),
                         (ws / "data" / "checkpoint" / "state.json", "input data/checkpoint/state.json changed"),
                         (ws / "data" / ".hidden", "input data/.hidden changed")]:
        path.write_text("changed " + path.name)
        assert stale_reasons(ws, stage()) == [reason]
        assert run_stage(ws, stage())[0]
    (ws / "data" / "new.txt").write_text("x")
    assert stale_reasons(ws, stage()) == ["input data/new.txt is new"]
    (ws / "out.json").unlink()
    assert stale_reasons(ws, stage()) == ["input data/new.txt is new", "output out.json is missing"]
    assert len(calls) == 4


def test_a_record_from_before_input_tracking_still_counts(tmp_path):
    """A record holding only the fingerprint (an older workspace) keeps the stage cached while nothing
    changed: the fingerprint is computed as it always was."""
    ws = tmp_path
    (ws / "in.txt").write_text("x")
    write_json(ws / "out.json", {})
    stage = Stage("s", lambda: None, inputs=["in.txt"], outputs=["out.json"], config={"a": 1})
    write_record(ws, stage, summary={})
    record = json.loads((ws / ".stages" / "s.json").read_text())
    write_json(ws / ".stages" / "s.json", {"fingerprint": record["fingerprint"], "summary": {}})
    assert stale_reasons(ws, stage) == []
    (ws / "in.txt").write_text("y")
    assert stale_reasons(ws, stage) == ["its record does not say what it ran with"]
    shutil.rmtree(ws / ".stages")
    assert stale_reasons(ws, stage) == ["it has not run to the end"]
