"""`shard: fsdp2` — the base and the adapter sharded with FSDP2 over 2 gloo processes on the CPU, the tiny Qwen3.

Measured by distributed_worker.py under torchrun: the sharded update equals the whole-batch update of one
process, each rank stores half of every weight, a sharded run trains the adapter a replicated (DDP) run
trains, a sharded run resumed from its checkpoint ends bit-identical to the uninterrupted one, and a
sharded run with rollouts from a server hot-swaps and checks the adapter after every step. Sharded runs
sample on a server (`tracerl serve`): in-process sampling is refused (tests/training/test_memory.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import save_tiny_base

from tracerl.training.checkpoint import load_optimizer_state

HERE = Path(__file__).parent
WORKER = HERE / "distributed_worker.py"
LEARNING_RATE = 2e-2  # letters_run.config's


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base"))


def torchrun(*args: str) -> None:
    command = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2", str(WORKER), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.fixture(scope="module")
def fsdp_run(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    torchrun(base, str(out), "train", "--shard", "fsdp2", "--steps", "2")
    return out


def adapter(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "adapter_model.safetensors"))


def rows(directory: Path) -> list[dict]:
    return [json.loads(x) for x in (directory / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sharded_update_equals_one_process_and_each_rank_holds_half(base, tmp_path):
    torchrun(base, str(tmp_path), "same-batch")
    got = json.loads((tmp_path / "same-batch.json").read_text())
    assert got["micro_batches"] == [2, 1]  # ranks ran different numbers of micro-batches (the filler kept them in step)
    # the reduce-scattered gradient is the whole batch's (float summation order aside) …
    assert got["grad_allclose_rtol_1e-4"] and got["grad_max_abs"] > 0
    # … and so is the AdamW step: every parameter moved by ~lr, the two runs agree to far below it
    assert got["param_moved"] > 0.5 * LEARNING_RATE
    assert got["param_max_abs_diff"] < 1e-2 * LEARNING_RATE
    # each rank stores half of the frozen base and half of the adapter
    for rank in got["ranks"]:
        assert rank["base_local"] == got["base_total"] // 2
        assert rank["adapter_local"] == got["adapter_total"] // 2


@pytest.mark.slow
def test_sharded_run_trains_the_replicated_runs_adapter(base, fsdp_run, tmp_path):
    """Two steps (hinted rollouts, 2 optimizer steps each) under DDP-style replicas and under FSDP2."""
    torchrun(base, str(tmp_path), "train", "--shard", "none", "--steps", "2")
    ddp, fsdp = adapter(tmp_path), adapter(fsdp_run)
    assert ddp.keys() == fsdp.keys()
    # the same rollouts (sampled on the server, the same adapter hot-swapped in) …
    same = ("step", "rollouts_used", "reward_mean", "informative_groups", "trained_sequences", "loss_tokens")
    assert [{k: r.get(k) for k in same} for r in rows(tmp_path)] == [{k: r.get(k) for k in same} for r in rows(fsdp_run)]
    # … and the same adapter up to float summation order (measured 1.7e-5 on 2026-12-02; an AdamW step moves ~lr)
    worst = max((ddp[k] - fsdp[k]).abs().max().item() for k in ddp)
    assert worst < 1e-2 * LEARNING_RATE, worst
    # the sharded run's checkpoint holds whole tensors, as an unsharded run's does
    state = load_optimizer_state(fsdp_run / "checkpoint")["state"]
    ref = load_optimizer_state(tmp_path / "checkpoint")["state"]
    assert {i: {k: getattr(v, "shape", v) for k, v in s.items()} for i, s in state.items()} == \
           {i: {k: getattr(v, "shape", v) for k, v in s.items()} for i, s in ref.items()}


@pytest.mark.slow
def test_sharded_run_resumed_ends_bit_identical(base, fsdp_run, tmp_path):
    """1 step, then --resume to 2: the checkpoint's whole tensors are sharded back exactly (optimizer state too)."""
    torchrun(base, str(tmp_path), "train", "--shard", "fsdp2", "--steps", "1")
    torchrun(base, str(tmp_path), "train", "--shard", "fsdp2", "--steps", "2", "--resume")
    a, b = adapter(fsdp_run), adapter(tmp_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the same rows, but for step 1's evaluation, which the 1-step run added as its last step
    strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith("seconds")  # noqa: E731
                         and not (k in ("eval_success", "eval_episodes") and r["step"] == 1)} for r in rs]
    assert strip(rows(fsdp_run)) == strip(rows(tmp_path))


@pytest.mark.slow
def test_sharded_run_with_server_rollouts(base, tmp_path):
    """Rollouts from `tracerl serve`; rank 0 swaps the adapter and checks it while rank 1 joins its forwards."""
    torchrun(base, str(tmp_path), "server")
    got = json.loads((tmp_path / "server.json").read_text())
    assert got["swaps"] == 1 + 2  # the initial adapter, then after each step
    assert got["served_equals_saved"] and got["trained"]
    assert got["served_check_difference"][0] < 2e-3  # the served adapter's log-probs are the sharded trainer's
    for row in got["rows"]:
        if row.get("loss") is not None:  # the server sampled with the previous step's adapter: first-pass ratio 1
            assert row["approx_kl"] < 1e-5 and row["clip_ratio"] == 0.0


@pytest.mark.slow
def test_tracerl_train_with_shard_fsdp2_under_torchrun(tmp_path):
    """The documented command: `torchrun … tracerl train --config --server` with `shard: fsdp2` writes a loadable
    adapter (the tiny base with room for the airline's prompt, which the server must score)."""
    from peft import PeftModel
    from training_helpers import tiny_model, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 32768
    base = str(tmp_path / "base")
    model.save_pretrained(base)
    tok.save_pretrained(base)

    cfg = tmp_path / "train.yaml"
    cfg.write_text("num_generations: 2\ngroups_per_step: 1\nmax_steps: 1\nrollout: {max_new_tokens: 4}\neval_episodes: 0\n"
                   "learning_rate: 0.01\nlora: {r: 4, lora_alpha: 8}\nshard: fsdp2\n")
    out = tmp_path / "out"
    model, tok = load_model(base)
    with ServerThread(LocalPolicy(model, tok, logprobs_mode="processed_logprobs")) as server:
        command = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2", "-m",
                   "tracerl.cli", "train", "--env", "airline", "--base", base, "--out", str(out), "--config", str(cfg),
                   "--server", server.base_url, "--json"]
        run = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                             timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["world_size"] == 2 and summary["steps"] == 1
    assert json.loads((out / "train_config.json").read_text())["config"]["shard"] == "fsdp2"
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(out))  # whole tensors, PEFT's names
