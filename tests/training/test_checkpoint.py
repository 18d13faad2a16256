"""Checkpoints survive a kill at any point of their write; stale temporary folders are cleaned up."""

import os
import pathlib
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tracerl.core.errors import InputError
from tracerl.training import checkpoint as ckpt


def _model_and_optimizer(tiny_model):
    torch.manual_seed(0)
    model = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    return model, optimizer, params


def test_interrupted_swap_falls_back_to_the_previous_checkpoint(tiny_model, tmp_path):
    model, optimizer, params = _model_and_optimizer(tiny_model)
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=3, rollouts_used=96, metrics_rows=4),
                         [ckpt.rng_state()], [{"step": i, "rollouts_used": 32 * i} for i in range(4)])
    saved = [p.detach().clone() for p in params]
    # a kill between "checkpoint → .checkpoint.old" and "new → checkpoint" leaves only the old one
    os.replace(tmp_path / "checkpoint", tmp_path / ".checkpoint.old")
    (tmp_path / ".checkpoint.abc123").mkdir()  # and a half-written temporary folder
    found = ckpt.latest_checkpoint(tmp_path)
    assert found == tmp_path / ".checkpoint.old"
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    state = ckpt.load_checkpoint(found, model, optimizer, rank=0)
    assert (state.step, state.rollouts_used, state.metrics_rows) == (3, 96, 4)
    assert all(torch.equal(a, b) for a, b in zip(params, saved))
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=4), [ckpt.rng_state()], [])
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_rng_states_round_trip(tiny_model, tmp_path):
    import random

    import numpy as np

    model, optimizer, _ = _model_and_optimizer(tiny_model)
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=1), [ckpt.rng_state()], [])
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    ckpt.load_checkpoint(tmp_path / "checkpoint", model, optimizer, rank=0)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no `except Exception`, no cleanup of ours)."""


def test_a_kill_at_every_write_of_a_checkpoint_leaves_one_whole_step(tiny_model, tmp_path, monkeypatch):
    """Die before the n-th file operation of a checkpoint write, for every n: the latest checkpoint is then the
    previous step or the new one, never a mix (weights, optimizer, counters and metrics rows of one step)."""
    model, optimizer, params = _model_and_optimizer(tiny_model)

    def step_state(step):
        with torch.no_grad():
            for p in params:
                p.fill_(float(step))
        optimizer.state[params[0]]["exp_avg"].fill_(float(step))
        return ckpt.TrainState(step=step, rollouts_used=8 * step, metrics_rows=step + 1), [{"step": i, "rollouts_used": 8 * i} for i in range(step + 1)]

    real = {"replace": os.replace, "rmtree": shutil.rmtree, "save_file": ckpt.save_file, "write_text": pathlib.Path.write_text,
            "save_pretrained": model.save_pretrained}
    n, finished = 0, False
    while not finished:
        out = tmp_path / f"kill-{n}"
        out.mkdir()
        ckpt.save_checkpoint(out, model, optimizer, *_with_rng(*step_state(3)))
        calls = [0]

        def dying(name):
            def op(*args, **kwargs):
                calls[0] += 1
                if calls[0] > n:
                    raise Killed(name)
                return real[name](*args, **kwargs)
            return op

        monkeypatch.setattr(os, "replace", dying("replace"))
        monkeypatch.setattr(shutil, "rmtree", dying("rmtree"))
        monkeypatch.setattr(ckpt, "save_file", dying("save_file"))
        monkeypatch.setattr(pathlib.Path, "write_text", dying("write_text"))
        monkeypatch.setattr(model, "save_pretrained", dying("save_pretrained"))
        try:
            ckpt.save_checkpoint(out, model, optimizer, *_with_rng(*step_state(4)))
            finished = True
        except Killed:
            pass
        monkeypatch.undo()
        found = ckpt.latest_checkpoint(out)
        assert found is not None, f"no checkpoint after a kill before operation {n + 1}"
        with torch.no_grad():
            for p in params:
                p.fill_(-1.0)
        state = ckpt.load_checkpoint(found, model, optimizer, rank=0)
        rows = ckpt.checkpoint_metrics(found, state, out / "metrics.jsonl")
        step = state.step
        assert step in (3, 4) and (not finished or step == 4)
        assert (state.rollouts_used, state.metrics_rows, rows) == (8 * step, step + 1, [{"step": i, "rollouts_used": 8 * i} for i in range(step + 1)])
        assert all(torch.equal(p, torch.full_like(p, float(step))) for p in params)
        assert torch.equal(optimizer.state[params[0]]["exp_avg"], torch.full_like(params[0], float(step)))
        # the next write cleans up whatever the kill left behind
        ckpt.save_checkpoint(out, model, optimizer, *_with_rng(*step_state(5)))
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint"], n
        n += 1
    assert n >= 8  # the write has that many operations, each one a kill point


class Planted:
    """A pickle that runs os.system when unpickled (what a planted optimizer.pt would do on resume)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_is_never_loaded(tiny_model, tmp_path):
    """Resume reads only safetensors and JSON: a malicious optimizer.pt / rng-rank0.pt beside them is ignored,
    and a checkpoint with only the pickle (the older format) is refused — the pickle never runs."""
    import pickle

    model, optimizer, params = _model_and_optimizer(tiny_model)
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=2), [ckpt.rng_state()], [])
    found = tmp_path / "checkpoint"
    assert sorted(p.name for p in found.iterdir()) == ["adapter", "metrics.jsonl", "optimizer.json",
                                                       "optimizer.safetensors", "rng-rank0.json", "state.json"]
    marker = tmp_path / "pwned"
    for name in ("optimizer.pt", "rng-rank0.pt"):
        (found / name).write_bytes(pickle.dumps(Planted(marker)))
    expected = {k: v.clone() for k, v in optimizer.state[params[0]].items()}
    for p in params:
        optimizer.state[p]["exp_avg"].zero_()
    assert ckpt.load_checkpoint(found, model, optimizer, rank=0).step == 2
    assert all(torch.equal(optimizer.state[params[0]][k], v) for k, v in expected.items())
    assert not marker.exists()
    for name in ("optimizer.json", "optimizer.safetensors"):
        (found / name).unlink()
    with pytest.raises(InputError, match=r"optimizer state is a pickle \(optimizer.pt, an older format\), which is never loaded"):
        ckpt.load_checkpoint(found, model, optimizer, rank=0)
    assert not marker.exists()


def test_the_optimizer_state_round_trips_exactly(tiny_model, tmp_path):
    model, optimizer, params = _model_and_optimizer(tiny_model)
    before = optimizer.state_dict()
    ckpt.save_optimizer_state(before, tmp_path)
    after = ckpt.load_optimizer_state(tmp_path)
    assert after["param_groups"] == [{**g, "betas": list(g["betas"])} for g in before["param_groups"]]
    assert before["state"].keys() == after["state"].keys()
    for i, values in before["state"].items():
        assert values.keys() == after["state"][i].keys()
        assert all(torch.equal(values[k], after["state"][i][k]) and values[k].dtype == after["state"][i][k].dtype
                   for k in values)
    (tmp_path / "optimizer.json").write_text('{"state": {"0": {"tensors": ["nope"], "values": {}}}, "param_groups": []}')
    with pytest.raises(InputError, match="not an optimizer state"):
        ckpt.load_optimizer_state(tmp_path)


def _with_rng(state, rows):
    return state, [ckpt.rng_state()], rows


ROW0 = {"step": 0, "rollouts_used": 0, "eval_success": 0.25}
ROW1 = {"step": 1, "rollouts_used": 8, "reward_mean": 0.5}


def test_resume_keeps_the_checkpoint_rows_not_later_ones(tmp_path):
    """metrics.jsonl may hold a row the killed run logged after its last checkpoint: the checkpoint's rows win."""
    state = ckpt.TrainState(step=1, metrics_rows=2)
    (tmp_path / "metrics.jsonl").write_text(ckpt.metrics_text([ROW0, ROW1, {"step": 2, "rollouts_used": 16, "loss": 0.25}]))
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    assert ckpt.checkpoint_metrics(folder, state, tmp_path / "metrics.jsonl") == [ROW0, ROW1]  # no copy: first rows
    (folder / "metrics.jsonl").write_text(ckpt.metrics_text([ROW0, {**ROW1, "loss": 0.5}]))
    assert ckpt.checkpoint_metrics(folder, state, tmp_path / "metrics.jsonl") == [ROW0, {**ROW1, "loss": 0.5}]
    (folder / "metrics.jsonl").write_text(ckpt.metrics_text([ROW0]))
    with pytest.raises(InputError, match="counts 2 metrics rows, 1 found"):
        ckpt.checkpoint_metrics(folder, state, tmp_path / "metrics.jsonl")


def test_metrics_rows_are_written_and_read_through_their_contract(tmp_path):
    """Rows keep exactly the fields logged (none added); a field MetricsRow does not know is refused."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(ckpt.metrics_text([ROW0, ROW1]))
    assert ckpt.read_metrics(path) == [ROW0, ROW1]
    assert path.read_text().splitlines()[0] == '{"step":0,"rollouts_used":0,"eval_success":0.25}'
    with pytest.raises(ValueError, match="rollouts\n"):
        ckpt.metrics_text([{"step": 0, "rollouts": 0, "rollouts_used": 0}])
    path.write_text('{"step": 0, "rollouts": 0}\n')
    with pytest.raises(InputError, match="metrics.jsonl:1: missing field 'rollouts_used'"):
        ckpt.read_metrics(path)
