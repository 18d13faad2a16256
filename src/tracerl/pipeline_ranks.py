"""One training stage of a `tracerl run` workspace on every rank of a torchrun launch — what `tracerl run`
starts for its training stages (train:<capability>, grpo_target, swe_rl) when
`distributed.nproc_per_node` > 1:

    torchrun --standalone --nproc_per_node=N -m tracerl.pipeline_ranks WORKSPACE STAGE --sections FILE [--force]

FILE holds the stage's sections of the run config as `tracerl run` was given them (a field left out stays
unset: an environment's own hint_fraction applies unless the config sets one). Every rank runs the stage's
function with that view of the config, as the pipeline does, on the ranks (`run_train`'s world: groups
sharded, gradients summed, rank 0 writing the adapter into the workspace); rank 0 prints the stage's
summary as one JSON line.
The stage's record (.stages/) is written by the `tracerl run` that started the launch, once it has ended.
An `InputError` is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from tracerl.config import RunConfig
from tracerl.contracts import Workspace
from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, read_json
from tracerl.pipeline import BASELINES, SECTIONS, StageFunctions
from tracerl.stages import View
from tracerl.training.distributed import init_world, shutdown


def run_stage_on_ranks(workspace: Path, stage: str, sections: Path, force: bool) -> dict | None:
    """Run training stage `stage` ("train:<capability>", "grpo_target" or "swe_rl") of `workspace` on this rank, with the
    run config's sections in `sections`; rank 0 returns its summary."""
    kind, _, capability = stage.partition(":")
    if kind not in ("train", *BASELINES) or (kind == "train") != bool(capability):
        raise InputError(f"not a training stage: {stage!r} (train:<capability>, {', '.join(BASELINES)})")
    try:
        config = RunConfig.model_validate(read_json(sections))
    except ValidationError as e:
        raise InputError(describe_validation_error(e), path=str(sections)) from None
    world = init_world()
    try:
        fns = StageFunctions(Workspace(workspace), Console(stderr=True, quiet=not world.is_main))
        fns.forcing = force
        view = View(config, SECTIONS[kind])
        summary = fns.train(view, capability, world=world) if kind == "train" else getattr(fns, kind)(view, world=world)
    finally:
        shutdown(world)
    return summary if world.is_main else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracerl.pipeline_ranks", description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("stage")
    ap.add_argument("--sections", type=Path, required=True, help="the stage's run-config sections (JSON)")
    ap.add_argument("--force", action="store_true", help="start the stage's training over")
    args = ap.parse_args(argv)
    try:
        summary = run_stage_on_ranks(args.workspace, args.stage, args.sections, args.force)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if summary is not None:
        print(json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
