"""Checkpoints survive a kill at any point of the swap; stale temporary folders are cleaned up."""

import os

import torch
from peft import LoraConfig, get_peft_model

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
                         [ckpt.rng_state()])
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
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=4), [ckpt.rng_state()])
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_rng_states_round_trip(tiny_model, tmp_path):
    import random

    import numpy as np

    model, optimizer, _ = _model_and_optimizer(tiny_model)
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    ckpt.save_checkpoint(tmp_path, model, optimizer, ckpt.TrainState(step=1), [ckpt.rng_state()])
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    ckpt.load_checkpoint(tmp_path / "checkpoint", model, optimizer, rank=0)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]
