from tracerl.core.io import write_json
from tracerl.stages import Stage, is_complete, run_stage


def make_stages(ws, calls, cfg=1):
    def first():
        calls.append("first")
        write_json(ws / "a.json", {"v": cfg})

    def second():
        calls.append("second")
        (ws / "out").mkdir(exist_ok=True)
        write_json(ws / "out" / "b.json", {"from": (ws / "a.json").read_text()})

    return [
        Stage("first", first, outputs=["a.json"], config={"cfg": cfg}),
        Stage("second", second, inputs=["a.json"], outputs=["out/b.json"]),
    ]


def test_stages_skip_when_unchanged_and_rerun_on_change(tmp_path):
    calls = []
    for stage in make_stages(tmp_path, calls):
        run_stage(tmp_path, stage)
    assert calls == ["first", "second"]
    for stage in make_stages(tmp_path, calls):
        assert run_stage(tmp_path, stage)[0] is False
    assert calls == ["first", "second"]
    # a changed config reruns the first stage; its new output changes the second's input
    for stage in make_stages(tmp_path, calls, cfg=2):
        run_stage(tmp_path, stage)
    assert calls == ["first", "second", "first", "second"]


def test_missing_output_or_force_reruns(tmp_path):
    calls = []
    stages = make_stages(tmp_path, calls)
    for stage in stages:
        run_stage(tmp_path, stage)
    (tmp_path / "out" / "b.json").unlink()
    assert not is_complete(tmp_path, stages[1]) and is_complete(tmp_path, stages[0])
    run_stage(tmp_path, stages[1])
    run_stage(tmp_path, stages[0], force=True)
    assert calls == ["first", "second", "second", "first"]


def test_a_stage_killed_before_its_record_is_redone(tmp_path):
    calls = []
    stages = make_stages(tmp_path, calls)
    run_stage(tmp_path, stages[0])
    (tmp_path / ".stages" / "first.json").unlink()  # as if killed after writing outputs, before the record
    assert run_stage(tmp_path, stages[0])[0] is True
