"""`tracerl train` and the pipeline's train stage are one function (`run_train`): they resume a run of
the same settings, refuse one of other settings naming them, and start over only when forced."""

import json
from pathlib import Path

import pytest
import torch
from training_helpers import save_tiny_base

from tracerl.cli import main
from tracerl.config import RunConfig
from tracerl.contracts import (
    CapabilitiesFile, EnvIndex, EnvRecord, EnvSpec, LabelerInfo, SelectionSettings, TrainRun, Totals,
)
from tracerl.core.errors import InputError
from tracerl.core.io import write_json, write_jsonl
from tracerl.pipeline import Pipeline
from tracerl.stages import fingerprint
from tracerl.envs.synthetic.envdir import env_digest, write_env_dir
from tracerl.synthesis.target import load_target

CAP = "precondition_verification"
TRAIN = {"num_generations": 2, "groups_per_step": 2, "max_steps": 1, "eval_episodes": 2, "learning_rate": 0.002,
         "lora": {"r": 4, "lora_alpha": 8}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_base(tmp_path_factory.mktemp("base"))


class Cli:
    """`tracerl train` on the environment directory `env` into `out`."""

    def __init__(self, base: str, env: Path, out: Path, tmp: Path):
        self.base, self.env, self.out, self.tmp = base, env, out, tmp

    def train(self, capsys, *, force: bool = False, **changes) -> dict | str:
        config = self.tmp / "train.yaml"
        config.write_text(json.dumps({**TRAIN, **changes, "rollout": {"max_new_tokens": 6}}))
        code = main(["train", "--env", str(self.env), "--base", self.base, "--out", str(self.out), "--config",
                     str(config), "--json"] + (["--force"] if force else []))
        captured = capsys.readouterr()
        return json.loads(captured.out) if code == 0 else captured.err


class Run:
    """The pipeline's train stage over a workspace whose collect, select and synthesize stages are done.
    A killed stage is one without its record (the record is written last)."""

    def __init__(self, base: str, ws: Path):
        self.base, self.ws, self.out = base, ws, ws / "adapters" / CAP
        envs = ws / "envs"
        write_env_dir(envs / CAP, EnvSpec(capability=CAP, template=CAP, target="airline"), load_target("airline"))
        EnvIndex(target="airline", generator="template", environments=[
            EnvRecord(capability=CAP, status="DONE", environment=CAP, source="template")]).write(envs / "index.json")
        write_jsonl(ws / "rollouts" / "base.jsonl", [])
        CapabilitiesFile(params=SelectionSettings(rho=0.1, delta=0.2, k=1, n=1, bootstrap=0, seed=0),
                         totals=Totals(trajectories=0, failed=0, passed=0),
                         labeler=LabelerInfo(name="rules", deterministic=True, note=""), unlabelled_pairs=0,
                         capabilities=[]).write(ws / "capabilities.json")
        for stage in Pipeline(self.config(), ws).stages()[:3]:
            write_json(ws / ".stages" / f"{stage.name}.json", {"fingerprint": fingerprint(ws, stage), "summary": {}})

    def config(self, **changes) -> RunConfig:
        return RunConfig.model_validate({"model": {"base": self.base}, "rollout": {"max_new_tokens": 6},
                                         "train": {**TRAIN, **changes}})

    def kill(self) -> None:
        (self.ws / ".stages" / f"train:{CAP}.json").unlink()

    def train(self, *, force: bool = False, **changes) -> dict | str:
        """The train stage's summary (the run stops right after it), or the error."""
        class Stop(Exception):
            pass

        def on_stage(name: str, ran: bool, summary: dict) -> None:
            if name == f"train:{CAP}":
                raise Stop(summary)

        try:
            Pipeline(self.config(**changes), self.ws).run(force={"train"} if force else set(), on_stage=on_stage)
        except Stop as stop:
            return stop.args[0]
        except InputError as e:
            return str(e)
        raise AssertionError("the train stage did not run")


def steps(out: Path) -> int:
    return json.loads((out / "checkpoint" / "state.json").read_text())["step"]


def test_the_command_and_the_pipeline_resume_and_refuse_alike(base, tmp_path, capsys, monkeypatch):
    run = Run(base, tmp_path / "ws")
    cli = Cli(base, run.ws / "envs" / CAP, tmp_path / "cli-out", tmp_path)
    # a fresh run: the environment's hint fraction (0.25) applies, the config sets none
    for summary, out in ((cli.train(capsys), cli.out), (run.train(), run.out)):
        assert summary["resumed"] is False and steps(out) == 1
        assert TrainRun.read(out / "train_config.json").config["hint_fraction"] == 0.25
    assert TrainRun.read(cli.out / "train_config.json").config == TrainRun.read(run.out / "train_config.json").config
    # both record the environment's content digest (the pipeline's env path is workspace-relative, the command's not)
    digests = {TrainRun.read(out / "train_config.json").env_digest for out in (cli.out, run.out)}
    assert digests == {env_digest(run.ws / "envs" / CAP)}

    # the same settings with a raised max_steps: a killed run is resumed and continues
    run.kill()
    for summary, out in ((cli.train(capsys, max_steps=2), cli.out), (run.train(max_steps=2), run.out)):
        assert summary["resumed"] is True and steps(out) == 2
    # the same folder spelled another way (relative, through '..'): an environment is compared by content
    monkeypatch.chdir(tmp_path)
    cli.env = Path("ws") / "envs" / ".." / "envs" / CAP
    summary = cli.train(capsys, max_steps=2)
    assert not isinstance(summary, str) and summary["resumed"] is True and steps(cli.out) == 2, summary
    # other settings: refused, naming them, and the run is left as it was
    run.kill()
    for error, out in ((cli.train(capsys, learning_rate=0.01), cli.out), (run.train(learning_rate=0.01), run.out)):
        assert "holds a run of other settings (learning_rate)" in error and "force" in error, error
        assert steps(out) == 2 and TrainRun.read(out / "train_config.json").config["learning_rate"] == 0.002
    # forced: started over with the new settings
    for summary, out in ((cli.train(capsys, force=True, learning_rate=0.01), cli.out),
                         (run.train(force=True, learning_rate=0.01), run.out)):
        assert summary["resumed"] is False and steps(out) == 1
        assert TrainRun.read(out / "train_config.json").config["learning_rate"] == 0.01
    # the same settings on an environment whose content changed (same folder): refused, naming it
    env_json = run.ws / "envs" / CAP / "env.json"
    EnvSpec.read(env_json).model_copy(update={"difficulty": 2}).write(env_json)
    error = cli.train(capsys, learning_rate=0.01)
    assert "holds a run of other settings (env content)" in error, error


def test_a_stage_that_finished_with_other_settings_is_replaced(base, tmp_path):
    """The stage's record says it finished: its run is the pipeline's own output, rebuilt like any stage's."""
    run = Run(base, tmp_path / "ws")
    assert run.train()["resumed"] is False
    summary = run.train(learning_rate=0.01)
    assert summary["resumed"] is False and steps(run.out) == 1
    assert TrainRun.read(run.out / "train_config.json").config["learning_rate"] == 0.01


def test_force_deletes_only_the_runs_files(base, tmp_path, capsys):
    cli = Cli(base, "airline", tmp_path / "out", tmp_path)
    cli.out.mkdir()
    (cli.out / "notes.txt").write_text("mine")
    assert cli.train(capsys)["resumed"] is False
    (cli.out / "metrics.jsonl").write_text("")  # would fail to read if it were not replaced
    assert cli.train(capsys, force=True)["steps"] == 1
    assert (cli.out / "notes.txt").read_text() == "mine"
