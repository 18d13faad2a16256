"""`run_train`: one GRPO run into one folder — what `tracerl train` and the pipeline's train and
grpo_target stages all call, so they resolve the config and treat an existing folder alike.

The folder `out`:

- holds no checkpoint: a fresh run starts (what a run killed before its first checkpoint left is
  overwritten);
- holds a checkpoint of a run with the same settings (only `max_steps` and `max_rollouts` may
  differ): it is resumed — a killed run continues, a finished one stops at once or trains on to a
  raised `max_steps`;
- holds a checkpoint of other settings (config, base model or environment): refused with one line
  naming them, unless `force`, which deletes that run's files and starts over.

The environment's own training defaults (a synthesized environment's `hint_fraction`) apply unless
the config sets the field itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tracerl.contracts import ADAPTER_WEIGHTS, METRICS_FILE, SNAPSHOTS, TrainRun
from tracerl.core.errors import InputError
from tracerl.envs.synthetic.envdir import env_digest
from tracerl.models.local import resolved_dtype
from tracerl.training import checkpoint as ckpt
from tracerl.training.config import TrainConfig
from tracerl.training.distributed import World, barrier
from tracerl.training.run import build_trainer, resolve_env
from tracerl.training.trainer import run_changes

RUN_FILES = ("train_config.json", METRICS_FILE, ckpt.CHECKPOINT, ckpt._OLD, ADAPTER_WEIGHTS,
             "adapter_config.json", "served_adapters", SNAPSHOTS)  # what a training run writes into its folder


@dataclass
class TrainEnv:
    """What a run trains on: an environment factory and how the run records it."""
    make: Callable[[], Any]
    source: str  # recorded in train_config.json (an env directory or the target's name); a resumed run must match
    name: str  # shown in progress and summaries
    hint_fraction: float | None = None  # the environment's own; the config's wins when it sets one
    make_eval: Callable[[], Any] | None = None  # held-out evaluation (default: `make`)
    digest: str | None = None  # a synthesized environment's content digest (train_config.json's env_digest)

    @classmethod
    def resolve(cls, spec: str | Path) -> TrainEnv:
        """A synthesized environment directory (validated) or a registered environment name."""
        make, name, defaults = resolve_env(spec)
        digest = env_digest(spec) if Path(spec).is_dir() else None
        return cls(make, str(spec), name, defaults.get("hint_fraction"), digest=digest)


class TrainSummary(BaseModel):
    capability: str = Field(description="The environment's name.")
    out: str
    resumed: bool = Field(description="Continued a run found in `out` (killed, or finished with a lower max_steps).")
    steps: int
    rollouts_used: int
    eval_success_first: float | None = None
    eval_success_last: float | None = None
    seconds: float = Field(description="Training seconds summed over the metrics rows (resumed parts included).")
    world_size: int = 1
    rank: int = 0
    dtype: str | None = Field(None, description="The precision the base was trained in.")


def resolve_config(config: TrainConfig, env: TrainEnv) -> TrainConfig:
    """`config` with the environment's hint fraction, unless the config sets hint_fraction itself."""
    if "hint_fraction" not in config.model_fields_set and env.hint_fraction:
        return config.model_copy(update={"hint_fraction": float(env.hint_fraction)})
    return config


def prepare_out(out: Path, config: TrainConfig, *, base: str, env_source: str, force: bool,
                world: World = World(), env_digest: str | None = None, dtype: str | None = None) -> bool:
    """Whether the run in `out` is resumed (the module's rules); with `force`, rank 0 first deletes it."""
    if force:
        if world.is_main:
            clear_run(out)
        barrier(world)
        return False
    if ckpt.latest_checkpoint(out) is None:  # `.checkpoint.old` counts: a kill mid-swap
        return False
    saved = out / "train_config.json"
    if saved.exists():
        changes = run_changes(TrainRun.read(saved), config, base=str(base), env=env_source, env_digest=env_digest,
                              dtype=dtype)
        if changes:
            raise InputError(f"holds a run of other settings ({', '.join(changes)}); only max_steps and max_rollouts "
                             "may change: force starts it over (tracerl train --force, tracerl run --force STAGE) "
                             "or choose another folder", path=str(out))
    return True


def clear_run(out: Path) -> None:
    """Delete the files a training run wrote into `out` (nothing else there)."""
    if not out.is_dir():
        return
    ckpt.remove_temporaries(out)
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def run_train(env: TrainEnv, base: str, out: str | Path, config: TrainConfig, *, force: bool = False,
              world: World = World(), init_adapter: str | Path | None = None, server_url: str | None = None,
              served_model: str | None = None, on_step: Callable[[dict[str, Any]], None] | None = None,
              dtype: str | None = None, device: str | None = None,
              served_tolerance: float | None = None) -> TrainSummary:
    """Train (or resume) one adapter into `out`, the base loaded in `dtype` on `device`
    (`tracerl.models.placement` names); every input is checked before the model loads."""
    out = Path(out)
    config = resolve_config(config, env)
    dtype = resolved_dtype(base, dtype)
    resume = prepare_out(out, config, base=base, env_source=env.source, force=force, world=world, env_digest=env.digest,
                         dtype=None if dtype == "auto" else dtype)
    trainer = build_trainer(config, base, env.make, out, env_source=env.source, env_digest=env.digest, world=world,
                            init_adapter=init_adapter, server_url=server_url, served_model=served_model,
                            on_step=on_step, make_eval_env=env.make_eval, dtype=dtype, device=device,
                            served_tolerance=served_tolerance)
    rows = trainer.train(resume=resume)
    evals = [r["eval_success"] for r in rows if r.get("eval_success") is not None]
    return TrainSummary(
        capability=env.name, out=str(out), resumed=resume, steps=rows[-1]["step"] if rows else 0,
        rollouts_used=rows[-1]["rollouts_used"] if rows else 0,
        eval_success_first=evals[0] if evals else None, eval_success_last=evals[-1] if evals else None,
        seconds=round(sum(r.get("seconds", 0.0) or 0.0 for r in rows), 2), world_size=world.size, rank=world.rank,
        dtype=trainer.run_info["dtype"],
    )
