"""`kill -9` several times in one run, at seeded random points (mid-step and mid-checkpoint-write), each
time resumed: the adapter and metrics.jsonl end bit-identical to an uninterrupted run's."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from letters_run import config as letters_config
from safetensors.torch import load_file
from training_helpers import LetterEnv, save_tiny_base

from tracerl.training.run import build_trainer

HERE = Path(__file__).parent
SCRIPT = HERE / "letters_run.py"
STEPS, KILLS, SEED = 4, 4, 2026


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base"))


def _rows(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_once(base: str, out: Path, rng: random.Random) -> str:
    """Start (or resume) the run, SIGKILL it at a drawn point; what the kill left behind, or 'finished'."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    log = out.parent / "stderr.txt"  # a file, not a pipe: an unread pipe would stall the child when full
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), base, str(out), "--steps", str(STEPS), "--resume"],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    start = _rows(out)
    # a new metrics row means the step is done and its checkpoint is being written: a small delay
    # lands inside that write, a larger one inside the next step
    delay = rng.choice([0.0, rng.uniform(0.0, 0.02), rng.uniform(0.02, 0.4)])
    deadline = time.time() + 300
    while proc.poll() is None and _rows(out) <= start and time.time() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    if proc.poll() is not None:
        assert proc.returncode == 0, log.read_text()[-2000:]
        return "finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = sorted(p.name for p in out.iterdir() if p.name.startswith(".") or p.name == "checkpoint") if out.exists() else []
    return f"{delay:.3f}s after row {_rows(out)}: {' '.join(left)}"


@pytest.mark.slow
def test_repeated_kill_9_resumes_bit_exact(base, tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "killed"
    torch.set_num_threads(1)
    build_trainer(letters_config(STEPS), base, LetterEnv, ref).train()  # uninterrupted, in this process
    rng = random.Random(SEED)
    kills = []
    while len(kills) < KILLS and (not kills or kills[-1] != "finished"):
        kills.append(_kill_once(base, out, rng))
    subprocess.run([sys.executable, str(SCRIPT), base, str(out), "--steps", str(STEPS), "--resume"], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = "; ".join(kills)
    print("kills:", report)
    assert sum(k != "finished" for k in kills) >= 2, report  # a late kill may find the run finished
    a = load_file(str(ref / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst == 0.0 and all(torch.equal(a[k], b[k]) for k in a), f"max abs difference {worst:.3g} ({report})"
    strip = lambda text: [{k: v for k, v in json.loads(x).items() if not k.endswith("seconds")}  # noqa: E731
                          for x in text.splitlines()]
    assert strip((out / "metrics.jsonl").read_text()) == strip((ref / "metrics.jsonl").read_text()), report
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == STEPS
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], report  # no temporaries left
