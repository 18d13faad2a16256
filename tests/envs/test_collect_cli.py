"""`tracerl collect`: the oracle reports 100%, the same seed writes the same bytes, bad flags exit 2."""

import json

import pytest

from tracerl.cli import main
from tracerl.core.io import read_jsonl
from tracerl.core.trajectory import Trajectory


def test_oracle_collect_reports_full_pass(tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    assert main(["collect", "--env", "airline", "--policy", "oracle", "--tasks", "200", "--split", "test",
                 "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "200 (100.0%)" in table and "user_stop 200" in table and "mean assistant turns" in table
    trajectories = read_jsonl(out, Trajectory)
    assert len(trajectories) == 200 and all(t.passed for t in trajectories)
    assert trajectories[0].seed == 1_000_000 and trajectories[0].domain == "airline"


def test_same_seed_gives_byte_identical_files(tmp_path, capsys):
    args = ["collect", "--policy", "flawed:0.3,0.3,0.3,0.3", "--tasks", "60", "--split", "train", "--json"]
    paths = [tmp_path / name for name in ("a.jsonl", "b.jsonl", "c.jsonl")]
    assert main([*args, "--seed", "7", "--out", str(paths[0])]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main([*args, "--seed", "7", "--out", str(paths[1])]) == 0
    assert main([*args, "--seed", "8", "--out", str(paths[2])]) == 0
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()
    assert summary["count"] == 60 and 0 < summary["pass_rate"] < 1
    assert set(summary["planted_faults"]) <= {"skip_precondition", "stop_early", "mispick", "corrupt_argument"}
    assert sum(kind["count"] for kind in summary["task_kinds"].values()) == 60


@pytest.mark.parametrize("flags, message", [
    (["--env", "nowhere"], "unknown environment 'nowhere'"),
    (["--policy", "bogus"], "bad policy spec 'bogus': not a reference policy of the airline domain"),
    (["--policy", "flawed:0.2,1.2"], "p2 = 1.2 is outside [0, 1]"),
    (["--policy", "flawed:a,b"], "must be numbers"),
    (["--split", "dev"], "unknown split 'dev' (expected one of train, test)"),
    (["--tasks", "0"], "--tasks must be at least 1"),
    (["--offset", "99999", "--split", "train", "--tasks", "5"], "split 'train' has 100000 tasks; asked for 5 from offset 99999"),
    (["--tau2-results", "r.json"], "--tau2 and --tau2-results are for a tau2:<domain> env, not 'airline'"),
    (["--env", "tau2:mock"], "--env tau2:mock needs --tau2 SETTINGS.yaml"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "r.jsonl"
    assert main(["collect", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_same_seed_same_bytes_across_processes(tmp_path):
    """Nothing depends on the interpreter's hash seed."""
    import os
    import subprocess
    import sys

    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"r{hash_seed}.jsonl"
        subprocess.run([sys.executable, "-c", "from tracerl.cli import entry; entry()", "collect", "--policy", "flawed",
                        "--tasks", "30", "--split", "train", "--seed", "3", "--out", str(out), "--json"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and outs[0]


def test_the_command_and_the_pipeline_collect_alike(tmp_path, capsys):
    """One function (`run_collect`): the embedded agent played greedily on the same train tasks gives the
    same rollouts from `tracerl collect` and from the pipeline's collect stage."""
    from tracerl.config import RunConfig
    from tracerl.pipeline import SECTIONS, Pipeline
    from tracerl.stages import View

    config = RunConfig.model_validate({"collect": {"tasks": 3}, "rollout": {"max_new_tokens": 160, "batch_size": 2}})
    ws = tmp_path / "ws"
    summary = Pipeline(config, ws).stage_fns.collect(View(config, SECTIONS["collect"]))
    out = tmp_path / "cli.jsonl"
    assert main(["collect", "--policy", "model", "--split", "train", "--tasks", "3", "--batch-size", "2",
                 "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == summary["trajectories"] == 3
    assert out.read_bytes() == (ws / "rollouts" / "base.jsonl").read_bytes()
