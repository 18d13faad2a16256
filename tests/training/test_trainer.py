"""The trainer on a real (small) environment with the tiny Qwen3 and the local backend."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from letters_run import config as letters_config
from training_helpers import LetterEnv, save_tiny_base
from safetensors.torch import load_file

from tracerl.contracts import adapter_snapshots
from tracerl.models.chat import ChatFormat
from tracerl.models.local import LocalPolicy
from tracerl.training.config import TrainConfig
from tracerl.training.run import build_trainer
from tracerl.envs.runner import Episode, rollout
from tracerl.training.sequences import training_sequence

HERE = Path(__file__).parent
SCRIPT = HERE / "letters_run.py"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base"))


def small(**kw) -> TrainConfig:
    args = dict(num_generations=4, groups_per_step=2, max_steps=2, learning_rate=1e-2, rollout={"max_new_tokens": 6},
                eval_episodes=4, eval_steps=2, lora={"r": 4, "lora_alpha": 8}, seed=1)
    args.update(kw)
    return TrainConfig(**args)


def test_train_writes_adapter_metrics_and_first_pass_ratio_is_one(base, tmp_path):
    torch.set_num_threads(1)
    rows = build_trainer(small(hint_fraction=0.5), base, LetterEnv, tmp_path).train()
    assert rows[0] == {"step": 0, "rollouts_used": 0, "eval_success": 0.0, "eval_episodes": 4}
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval_success" in rows[-1]
    fields = {"reward_mean", "reward_std", "success_rate", "informative_groups", "rollouts_used", "loss",
              "clip_ratio", "approx_kl", "entropy", "grad_norm", "seconds"}
    assert fields <= set(rows[1])
    for r in rows[1:]:
        # sampler log-probs (hinted ones recomputed on the hint-free context) match the trainer's:
        # before the first update the importance ratio is 1 on every loss token
        if r["loss"] is not None:
            assert r["approx_kl"] < 1e-6 and r["clip_ratio"] == 0.0
    assert rows[-1]["rollouts_used"] == sum(r.get("sampling_rounds", 0) for r in rows) * 8
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    # a plain PEFT directory: PeftModel.from_pretrained loads it onto the base
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert saved and any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)
    assert model.peft_config["default"].r == 4


def test_max_rollouts_counts_every_rollout(base, tmp_path):
    torch.set_num_threads(1)
    cfg = small(max_steps=50, max_rollouts=20, eval_steps=100)
    rows = build_trainer(cfg, base, LetterEnv, tmp_path).train()
    assert rows and rows[-1]["rollouts_used"] <= 20
    assert "eval_success" in rows[-1]  # the budget's last step is evaluated: first and last rows give the gain
    assert rows[-1]["rollouts_used"] == 8 * sum(r.get("sampling_rounds", 0) for r in rows)


def test_each_evaluation_keeps_the_adapter_it_measured(base, tmp_path):
    """snapshots/step_<n>/ at every evaluated step: the adapter a run stopped at step n ends with."""
    import shutil


    torch.set_num_threads(1)
    out = tmp_path / "three"
    rows = build_trainer(small(max_steps=3, eval_steps=2), base, LetterEnv, out).train()
    assert [r["step"] for r in rows if "eval_success" in r] == [0, 2, 3]
    kept = adapter_snapshots(out)
    assert list(kept) == [0, 2, 3]
    weights = {step: load_file(str(path / "adapter_model.safetensors")) for step, path in kept.items()}
    final = load_file(str(out / "adapter_model.safetensors"))
    assert weights[3].keys() == final.keys() and all(torch.equal(weights[3][k], final[k]) for k in final)
    assert all(not v.any() for k, v in weights[0].items() if "lora_B" in k)  # before training: B = 0
    build_trainer(small(max_steps=2, eval_steps=2), base, LetterEnv, tmp_path / "two").train()
    two = load_file(str(tmp_path / "two" / "adapter_model.safetensors"))
    assert all(torch.equal(weights[2][k], two[k]) for k in two)
    assert not all(torch.equal(weights[2][k], final[k]) for k in final)
    # a resumed run redoes the steps after its checkpoint: their snapshots go, as their metrics rows do
    shutil.copytree(kept[2], out / "snapshots" / "step_5")
    (out / "snapshots" / ".step_7.half").mkdir()
    build_trainer(small(max_steps=3, eval_steps=2), base, LetterEnv, out).train(resume=True)
    assert list(adapter_snapshots(out)) == [0, 2, 3]
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["step_0", "step_2", "step_3"]


def test_hints_never_reach_the_gradient(base):
    """Same sampled tokens, different hints in the sampling prompt ⇒ identical training ids and gradients."""
    torch.set_num_threads(1)
    from tracerl.models.local import load_model

    model, tok = load_model(base)
    chat = ChatFormat(tok)
    policy = LocalPolicy(model, tok, temperature=1.0, seed=0, max_new_tokens=6)
    traj = rollout(LetterEnv, policy, [Episode(seed=2, options={"hint": True})])[0]
    assert traj.info["hint"] and traj.tokens is not None
    hint_free = LetterEnv().reset(seed=2)[0]
    # the same episode with another hint text: re-template its prompt, keep the sampled part
    other_prompt = [hint_free[0], hint_free[1].model_copy(update={"content": hint_free[1].content + " Hint: zzzz"})]
    other = traj.model_copy(deep=True)
    p = traj.tokens.prompt_len
    other_ids = chat.prompt_ids(other_prompt, [])
    other.tokens.ids = other_ids + traj.tokens.ids[p:]
    other.tokens.logprobs = [0.0] * len(other_ids) + traj.tokens.logprobs[p:]
    other.tokens.mask = [0] * len(other_ids) + traj.tokens.mask[p:]
    other.tokens.prompt_len = len(other_ids)
    assert other.tokens.ids != traj.tokens.ids

    a = training_sequence(traj, 1.0, hint_free, chat.prompt_ids)
    b = training_sequence(other, 1.0, hint_free, chat.prompt_ids)
    assert a.ids == b.ids and a.mask == b.mask
    assert "Hint" not in chat.decode(a.ids) and "Hint" in chat.decode(traj.tokens.ids)
    assert a.ids[: len(chat.prompt_ids(hint_free, []))] == chat.prompt_ids(hint_free, [])

    def grad_of(seq):
        from tracerl.training.loss import BatchCounts, policy_loss, token_logprobs
        from tracerl.training.sequences import collate

        model.zero_grad()
        batch = collate([seq])
        logp, _ = token_logprobs(model, batch.ids, batch.attention_mask)
        loss, _ = policy_loss(logp, logp.detach(), batch.advantages, batch.loss_mask, BatchCounts(1, seq.num_loss_tokens))
        loss.backward()
        return torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])

    model.train()
    assert torch.equal(grad_of(a), grad_of(b))
    # control: without stripping, the hint does change the gradient (the test can fail)
    raw_a = training_sequence(traj, 1.0, None, chat.prompt_ids)
    raw_b = training_sequence(other, 1.0, None, chat.prompt_ids)
    assert not torch.equal(grad_of(raw_a), grad_of(raw_b))


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}


@pytest.mark.slow
def test_resume_after_kill_9_reaches_the_same_adapter(base, tmp_path):
    """Uninterrupted run vs a run killed with SIGKILL mid-training and resumed: equal weights, bit for bit.

    Exact equality holds here (CPU, one thread, every random draw seeded per step).
    """
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    torch.set_num_threads(1)
    build_trainer(letters_config(4), base, LetterEnv, ref).train()  # uninterrupted, in this process
    proc = subprocess.Popen([sys.executable, str(SCRIPT), base, str(killed)], env=_env())
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        metrics = killed / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # step 0 eval + 2 steps
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run([sys.executable, str(SCRIPT), base, str(killed), "--resume"], check=True, env=_env(), timeout=300)
    a = load_file(str(ref / "adapter_model.safetensors"))
    b = load_file(str(killed / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert strip(read(ref)) == strip(read(killed))
    assert json.loads((killed / "checkpoint" / "state.json").read_text())["step"] == 4


@pytest.mark.slow
def test_torchrun_two_processes_gloo(base, tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    out = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(SCRIPT), base, str(tmp_path),
                          "--check-ddp"], env=_env(), capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "DDP-OK" in out.stdout


@pytest.mark.slow
def test_tracerl_train_under_torchrun(base, tmp_path):
    """The same command, two gloo processes: rollouts and batch sharded, one adapter written."""
    torchrun = Path(sys.executable).parent / "torchrun"
    cfg = tmp_path / "train.yaml"
    cfg.write_text("num_generations: 2\ngroups_per_step: 2\nmax_steps: 2\nrollout: {max_new_tokens: 6}\neval_episodes: 2\n"
                   "learning_rate: 0.01\nlora: {r: 4, lora_alpha: 8}\n")
    out = tmp_path / "out"
    run = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(Path(sys.executable).parent / "tracerl"),
                          "train", "--env", "airline", "--base", base, "--out", str(out), "--config", str(cfg), "--json"],
                         env=_env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert json.loads((out / "train_config.json").read_text())["world_size"] == 2
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert (out / "adapter_model.safetensors").exists()
