"""Cache keys are complete: change any field of the run config and exactly the stages that read it,
and the ones downstream of them, rerun; the stages upstream stay cached.

No stage runs here: a workspace holds a stand-in for every output, each stage's record is written
with the real fingerprint, and "rerunning" a stage writes new content to its outputs (what a rerun
does when its config changed) and a new record. Every field is found by walking the pydantic models,
so a field added later is covered without touching this file.
"""

import json
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tracerl.config import RunConfig
from tracerl.contracts import EnvIndex, EnvRecord
from tracerl.pipeline import SECTIONS, Pipeline
from tracerl.stages import Stage, View, fingerprint, is_complete

CAPS = ["cap_a", "cap_b"]
CONFIG = {"baselines": {"single_adapters": True, "swe_rl": True},  # every kind of stage present (gepa needs an analysis model)
          "analysis": {"base_url": "http://127.0.0.1:9/v1", "model": "reflector"}}


def leaf_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every settable field of `model`, as a path; nested models are walked into."""
    out = []
    for name, info in model.model_fields.items():
        path = prefix + (name,)
        if path == ("train", "rollout"):
            continue  # a run config refuses it: the top-level `rollout` block is GRPO's
        inner = info.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out += leaf_fields(inner, path)
        else:
            out.append(path)
    return out


def literals(annotation: Any) -> list[Any]:
    """The values of a Literal annotation (also inside Optional/Union)."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) if typing.get_origin(arg) is typing.Literal
            for v in typing.get_args(arg)]


def candidates(value: Any, annotation: Any) -> list[Any]:
    """Values to try in place of `value` (the first one the config accepts is used)."""
    options = literals(annotation)
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value / 2, value + 0.05, value + 1.0, 0.5]
    if isinstance(value, str):
        return [x for x in options if x != value] + [value + "-changed"]
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return [type(value)([v / 2 for v in value])]
        return [value[:-1], list(value) + list(value[:1])]
    if value is None:
        return options + [1, 0.5, 4096, "/nonexistent/changed.json", True, [], [0]]
    raise AssertionError(f"no candidate for {value!r}")


def changed(config: RunConfig, path: tuple[str, ...]) -> RunConfig:
    data = config.model_dump(mode="json", exclude={"train": {"rollout"}})
    holder = data
    for part in path[:-1]:
        holder = holder[part]
    annotation = _annotation(path)
    for value in candidates(holder[path[-1]], annotation):
        holder[path[-1]] = value
        try:
            new = RunConfig.model_validate(data)
        except ValueError:
            continue
        if new.model_dump() != config.model_dump():
            return new
    raise AssertionError(f"no valid change found for {'.'.join(path)}")


def _annotation(path: tuple[str, ...]) -> Any:
    model: Any = RunConfig
    for part in path:
        annotation = model.model_fields[part].annotation
        model = annotation
    return annotation


def kind(stage: Stage) -> str:
    return stage.name.split(":")[0]


def build_workspace(ws: Path, config: RunConfig) -> None:
    """Every output of every stage present, every stage recorded as complete."""
    ws.mkdir(parents=True)
    write_output(ws, "envs/index.json", "0")
    pipeline = Pipeline(config, ws)
    (ws / "config.yaml").write_text(config.to_yaml())
    stages = pipeline.stages()
    for stage in stages:
        for out in stage.outputs:
            write_output(ws, out, f"{stage.name} 0")
    for stage in stages:
        record(ws, stage)


def write_output(ws: Path, out: str, content: str) -> None:
    """A stand-in for one output: the environment index keeps its capabilities (the graph reads them)."""
    if out == "envs/index.json":
        EnvIndex(target=f"airline ({content})", generator="template", environments=[
            EnvRecord(capability=c, status="DONE", environment=c, source="template") for c in CAPS]).write(ws / out)
    elif out in {f"envs/{cap}" for cap in CAPS}:
        write(ws / out / "env.json", json.dumps({"capability": Path(out).name, "content": content}))
    else:
        write(ws / out, content)


def record(ws: Path, stage: Stage) -> None:
    write(ws / ".stages" / f"{stage.name}.json", json.dumps({"fingerprint": fingerprint(ws, stage), "summary": {}}))


def write(path: Path, text: str) -> None:  # no fsync: these files are stand-ins
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rerun(ws: Path, config: RunConfig) -> set[str]:
    """Stages a `tracerl run` with `config` would run, each rerun changing its outputs."""
    (ws / "config.yaml").write_text(config.to_yaml())
    ran = set()
    for stage in Pipeline(config, ws).stages():  # in graph order, as `Pipeline.run` goes
        if not is_complete(ws, stage):
            for out in stage.outputs:
                write_output(ws, out, f"{stage.name} rerun")
            record(ws, stage)
            ran.add(stage.name)
    return ran


def downstream(stages: list[Stage], roots: set[str]) -> set[str]:
    """`roots` and every stage that reads (transitively) what they write."""
    out, written = set(roots), set()
    for stage in stages:  # the graph lists a stage after every stage it reads from
        if stage.name in out or any(_under(i, w) for i in stage.inputs for w in written):
            out.add(stage.name)
            written.update(stage.outputs)
    return out


def _under(path: str, written: str) -> bool:
    return written == path or written.startswith(path.rstrip("/") + "/")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, RunConfig]:
    config = RunConfig.model_validate(CONFIG)
    ws = tmp_path_factory.mktemp("cache") / "ws"
    build_workspace(ws, config)
    return ws, config


def test_an_unchanged_config_reruns_nothing(built, tmp_path):
    ws, config = built
    copy = tmp_path / "ws"
    shutil.copytree(ws, copy)
    assert rerun(copy, config) == set()
    kinds = {kind(s) for s in Pipeline(config, copy).stages()}
    assert kinds == set(SECTIONS), "the workspace must hold every kind of stage"


FIELDS = leaf_fields(RunConfig)


def test_every_section_is_read_by_a_stage_or_shapes_the_graph():
    read = {section for sections in SECTIONS.values() for section in sections}
    graph_only = {"baselines", "train_rejected"}  # which stages exist / whether training may start
    assert set(RunConfig.model_fields) == read | graph_only
    assert len(FIELDS) > 80


@pytest.mark.parametrize("path", FIELDS, ids=[".".join(p) for p in FIELDS])
def test_changing_a_field_reruns_its_readers_and_what_follows_them(built, tmp_path, path):
    ws, config = built
    copy = tmp_path / "ws"
    shutil.copytree(ws, copy)
    new = changed(config, path)
    stages = Pipeline(new, copy).stages()
    readers = {s.name for s in stages if path[0] in SECTIONS[kind(s)]}
    expected = (downstream(stages, readers) | {"report"}) & {s.name for s in stages}  # the report reads config.yaml
    assert rerun(copy, new) == expected, ".".join(path)


def test_a_view_holds_only_its_sections():
    view = View(RunConfig(), SECTIONS["select"])
    assert view.select.rho == 0.10
    with pytest.raises(AttributeError):
        view.rollout  # noqa: B018
    assert json.dumps(view.key(), sort_keys=True)  # every field is JSON
    assert set(view.key()["select"]) == set(RunConfig().select.model_dump())


def test_the_original_stale_cache_case_max_new_tokens_reruns_collect(built, tmp_path):
    """The defect this guards against: 256 → 32 tokens per turn kept every fingerprint."""
    ws, config = built
    copy = tmp_path / "ws"
    shutil.copytree(ws, copy)
    new = config.model_copy(update={"rollout": config.rollout.model_copy(update={"max_new_tokens": 32})})
    assert {"collect", "synthesize", "compose", "eval:base"} <= rerun(copy, new)


def test_a_file_outside_the_workspace_is_keyed_by_its_content(tmp_path):
    """A capabilities file (or a target's tools/results/settings file) changed in place reruns its readers."""
    extra = tmp_path / "extra_capabilities.yaml"
    extra.write_text("- name: one\n")
    config = RunConfig.model_validate({**CONFIG, "select": {"capabilities": str(extra)}})
    ws = tmp_path / "ws"
    build_workspace(ws, config)
    extra.write_text("- name: two\n")
    stages = Pipeline(config, ws).stages()
    assert rerun(ws, config) == downstream(stages, {"select"}) | {"report"}
    assert "collect" not in downstream(stages, {"select"})
