"""Checkpoints: adapter, optimizer, RNG states, counters and metrics rows of one step — written atomically.

Layout inside the run's output directory (which is itself the PEFT adapter directory):

    adapter_config.json, adapter_model.safetensors   the latest adapter (PeftModel.from_pretrained(base, out))
    metrics.jsonl                                     one row per step (and the step-0 evaluation)
    train_config.json                                 resolved config, base model, environment
    snapshots/step_<n>/                               the PEFT adapter evaluated at step n (every row with
                                                      eval_success; its rollouts_used is that metrics row's)
    checkpoint/
        adapter/                                      PEFT adapter at `step`
        optimizer.pt                                  AdamW state
        rng-rank{r}.pt                                torch (CPU and CUDA) / python / numpy RNG states of each rank
        metrics.jsonl                                 the metrics rows up to `step`
        state.json                                    {"step", "rollouts_used", "metrics_rows"}

A new checkpoint is built in a temporary sibling folder and swapped in by renames, so a `kill -9`
at any moment leaves either the previous checkpoint or the new one, never a mix. A resumed run takes
everything from that one folder — its metrics rows included, so rows logged after it (by the killed
run) are dropped and redone, never kept twice; snapshots of steps after it are dropped with them.
A snapshot is written to a temporary sibling and renamed into place, so it is whole or absent.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file

from tracerl import contracts
from tracerl.contracts import METRICS_FILE, SNAPSHOTS, adapter_snapshots, metrics_text
from tracerl.core.errors import InputError
from tracerl.core.io import read_json, write_json

CHECKPOINT = "checkpoint"
_OLD = ".checkpoint.old"


@dataclass
class TrainState:
    step: int = 0
    rollouts_used: int = 0
    metrics_rows: int = 0


def rng_state() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl as the trainer keeps them, each read through `contracts.MetricsRow`
    ([] when there is none yet)."""
    return [r.model_dump(exclude_unset=True) for r in contracts.read_metrics(path)]


def save_adapter(model, directory: str | Path) -> None:
    """Save the PEFT adapter into `directory`, replacing its files one by one atomically.

    LoRA adapts linears only and the base's vocabulary is never resized, so no embedding layer is
    saved; PEFT's "auto" would look the base up (on the Hub for an alias such as "tiny-agent")."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".adapter.", dir=directory) as tmp:
        model.save_pretrained(tmp, save_embedding_layers=False)
        for f in sorted(Path(tmp).iterdir()):
            if f.is_file():
                os.replace(f, directory / f.name)


def save_snapshot(model, out: Path, step: int) -> Path:
    """Keep the adapter of `step` as `out/snapshots/step_<step>/` (a PEFT directory), replacing one there."""
    final = Path(out) / SNAPSHOTS / f"step_{step}"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=final.parent))
    model.save_pretrained(tmp, save_embedding_layers=False)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def drop_snapshots_after(out: Path, step: int) -> None:
    """Delete the snapshots of steps after `step` (a resumed run redoes those steps)."""
    for later, path in adapter_snapshots(out).items():
        if later > step:
            shutil.rmtree(path)


def save_checkpoint(out: Path, model, optimizer, state: TrainState, rank_rng: list[dict],
                    metrics: list[dict[str, Any]]) -> None:
    """Write checkpoint/ for `state` (rank 0 only; `rank_rng` holds every rank's RNG state, `metrics` the rows so far)."""
    if len(metrics) != state.metrics_rows:
        raise ValueError(f"{len(metrics)} metrics rows for a state that counts {state.metrics_rows}")
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint.", dir=out))
    model.save_pretrained(tmp / "adapter", save_embedding_layers=False)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    for rank, rng in enumerate(rank_rng):
        torch.save(rng, tmp / f"rng-rank{rank}.pt")
    (tmp / METRICS_FILE).write_text(metrics_text(metrics))
    write_json(tmp / "state.json", {"step": state.step, "rollouts_used": state.rollouts_used,
                                    "metrics_rows": state.metrics_rows})
    _fsync_dir(tmp)
    current, old = out / CHECKPOINT, out / _OLD
    remove_temporaries(out, keep=tmp)
    if old.exists() and current.exists():
        shutil.rmtree(old)
    if current.exists():
        os.replace(current, old)
    os.replace(tmp, current)
    _fsync_dir(out)
    shutil.rmtree(old, ignore_errors=True)


def remove_temporaries(out: Path, keep: Path | None = None) -> None:
    """Delete what a run killed mid-write leaves in `out`: half-written checkpoint, adapter and snapshot folders,
    temp files.

    `.checkpoint.old` stays while it is the only complete checkpoint (a kill between the two renames).
    """
    current, old = out / CHECKPOINT, out / _OLD
    for stale in [*out.glob(".checkpoint.*"), *out.glob(".adapter.*")]:
        if stale == keep or (stale == old and not (current / "state.json").exists()):
            continue
        shutil.rmtree(stale, ignore_errors=True)
    for stale in out.glob(".*.tmp"):  # atomic_write_text's temporary names
        stale.unlink(missing_ok=True)
    for stale in (out / SNAPSHOTS).glob(".step_*"):  # half-written snapshots
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint folder of `out`, if any (a swap interrupted midway leaves the old one)."""
    for name in (CHECKPOINT, _OLD):
        path = out / name
        if (path / "state.json").exists():
            return path
    return None


def load_checkpoint(path: Path, model, optimizer, rank: int) -> TrainState:
    """Restore adapter weights, optimizer and this rank's RNG states; return the saved counters (metrics: `checkpoint_metrics`)."""
    weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    set_peft_model_state_dict(model, weights)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    rng_file = path / f"rng-rank{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    data = read_json(path / "state.json")
    return TrainState(step=int(data["step"]), rollouts_used=int(data["rollouts_used"]),
                      metrics_rows=int(data["metrics_rows"]))


def checkpoint_metrics(path: Path, state: TrainState, out_metrics: Path) -> list[dict[str, Any]]:
    """The metrics rows of the checkpoint in `path` (checkpoints without their own copy: the first rows of `out_metrics`)."""
    rows = read_metrics(path / METRICS_FILE) if (path / METRICS_FILE).exists() else read_metrics(out_metrics)[: state.metrics_rows]
    if len(rows) != state.metrics_rows:

        raise InputError(f"{path}: the checkpoint counts {state.metrics_rows} metrics rows, {len(rows)} found")
    return rows


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
