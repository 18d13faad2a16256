"""`tracerl run` (and demo, eval) is single-process: under torchrun it refuses before reading or writing the
workspace, with one line that gives the torchrun `tracerl train` command to use instead."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.core.errors import InputError
from tracerl.commands.run import single_process

ROOT = Path(__file__).resolve().parents[2]
GPU_CONFIG = ROOT / "configs" / "qwen3-8b-gpu.yaml"
BIN = Path(sys.executable).parent


def tracerl(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tracerl"), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("size", [None, "1"])
def test_one_process_passes(monkeypatch, size):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if size is not None:
        monkeypatch.setenv("WORLD_SIZE", size)
    assert single_process("run", GPU_CONFIG, Path("ws")) is None


def test_run_with_world_size_2_refuses_before_touching_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    out = tracerl(["run", str(GPU_CONFIG), "-w", str(ws)], WORLD_SIZE="2", RANK="1", LOCAL_RANK="1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "`tracerl run` is single-process (started with WORLD_SIZE=2)" in lines[0]
    # the command it shows trains the workspace's environments with the config's base model and server
    assert "set distributed.nproc_per_node: 2 in the config" in lines[0]
    assert (f"`torchrun --nproc_per_node=2 -m tracerl.cli train --all --env {ws}/envs --out {ws}/adapters "
            f"--config {GPU_CONFIG} --base Qwen/Qwen3-8B --server http://127.0.0.1:8000/v1`") in lines[0]
    assert not ws.exists()


@pytest.mark.parametrize("command", ["demo", "eval"])
def test_demo_and_eval_refuse_too(tmp_path, command):
    ws = tmp_path / "ws"
    out = tracerl([command, "-w", str(ws)], WORLD_SIZE="4")
    assert out.returncode == 2 and f"`tracerl {command}` is single-process" in out.stderr
    assert not ws.exists()


def test_refusal_names_placeholders_when_the_config_is_unreadable(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match=r"--base BASE` "):
        single_process("run", tmp_path / "missing.yaml", tmp_path / "ws")


@pytest.mark.slow
def test_run_under_torchrun_refuses_and_writes_nothing(tmp_path):
    """A real 2-process torchrun launch: the ranks refuse with exit 2, nothing is written.

    torchrun stops the other rank (SIGTERM) as soon as one fails, so the second refusal may
    never be printed: at least one rank's refusal is, and torchrun reports its exit code 2."""
    ws = tmp_path / "ws"
    out = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "tracerl.cli", "run",
                          str(GPU_CONFIG), "-w", str(ws)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert text.count("`tracerl run` is single-process (started with WORLD_SIZE=2)") in (1, 2), text[-3000:]
    assert "exitcode  : 2" in text  # torchrun's summary of the failed ranks
    assert not ws.exists()
