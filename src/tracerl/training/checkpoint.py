"""Checkpoints: adapter, optimizer, RNG states, counters and metrics rows of one step — written atomically.

Layout inside the run's output directory (which is itself the PEFT adapter directory):

    adapter_config.json, adapter_model.safetensors   the latest adapter (PeftModel.from_pretrained(base, out))
    metrics.jsonl                                     one row per step (and the step-0 evaluation)
    train_config.json                                 resolved config, base model, environment
    snapshots/step_<n>/                               the PEFT adapter evaluated at step n (every row with
                                                      eval_success; its rollouts_used is that metrics row's)
    checkpoint/
        adapter/                                      PEFT adapter at `step`
        optimizer.safetensors, optimizer.json         AdamW state: its tensors, and the rest (param groups, scalars)
        rng-rank{r}.json                              torch (CPU and CUDA) / python / numpy RNG states of each rank
        metrics.jsonl                                 the metrics rows up to `step`
        state.json                                    {"step", "rollouts_used", "metrics_rows"}

Nothing is pickled: tensors go to safetensors, everything else to JSON, so loading a checkpoint runs no
code from it. A checkpoint in the pickle format of older versions (optimizer.pt) is refused, never
unpickled; stray .pt files are ignored.

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
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

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


OPTIMIZER_TENSORS, OPTIMIZER_JSON = "optimizer.safetensors", "optimizer.json"
PICKLED_OPTIMIZER = "optimizer.pt"  # older versions' format: refused, never loaded


def rng_state() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def rng_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rng-rank{rank}.json"


def save_rng_state(state: dict, file: Path) -> None:
    """`rng_state()` as JSON: byte tensors as lists of bytes, Mersenne Twister states as lists of integers."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss_next = state["python"]
    write_json(file, {
        "torch": state["torch"].tolist(),
        "cuda": None if state["cuda"] is None else [s.tolist() for s in state["cuda"]],
        "python": [version, list(internal), gauss_next],
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    })


def load_rng_state(file: Path) -> dict:
    """What `save_rng_state` wrote, in the shape `set_rng_state` takes; a malformed file is an InputError."""
    data = read_json(file)
    try:
        version, internal, gauss_next = data["python"]
        name, keys, pos, has_gauss, cached = data["numpy"]
        return {
            "torch": torch.tensor(data["torch"], dtype=torch.uint8),
            "cuda": None if data["cuda"] is None else [torch.tensor(s, dtype=torch.uint8) for s in data["cuda"]],
            "python": (int(version), tuple(int(x) for x in internal), None if gauss_next is None else float(gauss_next)),
            "numpy": (str(name), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
        }
    except (KeyError, TypeError, ValueError, OverflowError, RuntimeError) as e:
        raise InputError(f"not an RNG state ({type(e).__name__}: {e})", path=str(file)) from None


def save_optimizer_state(state: dict[str, Any], directory: Path) -> None:
    """An optimizer's `state_dict()`: its tensors to optimizer.safetensors (`<param index>.<name>`), the rest
    (param groups, non-tensor state values, which names are tensors) to optimizer.json."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for index, values in state["state"].items():
        entry: dict[str, Any] = {"tensors": [], "values": {}}
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
                entry["tensors"].append(key)
            else:
                entry["values"][key] = value
        meta[str(index)] = entry
    save_file(tensors, str(directory / OPTIMIZER_TENSORS))
    write_json(directory / OPTIMIZER_JSON, {"state": meta, "param_groups": state["param_groups"]})


def load_optimizer_state(directory: Path) -> dict[str, Any]:
    """What `save_optimizer_state` wrote, as a `state_dict()` (tensors on the CPU: `load_state_dict` moves
    them to their parameters); a checkpoint in the pickle format is refused, not loaded."""
    if not (directory / OPTIMIZER_JSON).exists() and (directory / PICKLED_OPTIMIZER).exists():
        raise InputError(f"the checkpoint's optimizer state is a pickle ({PICKLED_OPTIMIZER}, an older format), which "
                         "is never loaded: it could run any code; start the run over (tracerl train --force)",
                         path=str(directory))
    meta = read_json(directory / OPTIMIZER_JSON)
    try:
        tensors = load_file(str(directory / OPTIMIZER_TENSORS))
        state: dict[int, dict[str, Any]] = {}
        for index, entry in meta["state"].items():
            values = {key: tensors[f"{index}.{key}"] for key in entry["tensors"]}
            values.update(entry["values"])
            state[int(index)] = values
        return {"state": state, "param_groups": meta["param_groups"]}
    except (KeyError, TypeError, ValueError, OSError, SafetensorError) as e:
        raise InputError(f"not an optimizer state ({type(e).__name__}: {e})", path=str(directory)) from None


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
    save_optimizer_state(optimizer.state_dict(), tmp)
    for rank, rng in enumerate(rank_rng):
        save_rng_state(rng, rng_file(tmp, rank))
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
    optimizer.load_state_dict(load_optimizer_state(path))
    if rng_file(path, rank).exists():
        set_rng_state(load_rng_state(rng_file(path, rank)))
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
