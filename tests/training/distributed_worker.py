"""What tests/training/test_distributed_fsdp.py runs under torchrun (2 gloo processes, the tiny Qwen3, LetterEnv).

    torchrun --standalone --nproc_per_node=2 distributed_worker.py BASE OUT same-batch
    torchrun --standalone --nproc_per_node=2 distributed_worker.py BASE OUT train --shard fsdp2 --steps 2 [--resume]
    torchrun --standalone --nproc_per_node=2 distributed_worker.py BASE OUT server

same-batch: one update on one sampled batch, FSDP2-sharded vs one process on the whole batch (gradient,
AdamW step), with micro-batch counts that differ between the ranks, hinted rollouts, a KL term and the
output head over chunks of 4 tokens (`token_logprobs`' chunked path under FSDP2's root unit); rank 0
writes what it measured to OUT/same-batch.json (also each rank's share of the parameters).
train: `GRPOTrainer.train` with `shard` as given, into OUT (the adapter and metrics, as any run).
server: a sharded run, the adapter hot-swapped and checked after each step; rank 0 writes OUT/server.json.

Rollouts come from `tracerl serve` in rank 0's process (`serving`: one request at a time, so a rerun samples
exactly the same), as `shard: fsdp2` requires; same-batch samples its batch in one process.
"""

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from contextlib import contextmanager  # noqa: E402

from letters_run import config  # noqa: E402
from training_helpers import LetterEnv  # noqa: E402

from tracerl.training.advantages import group_advantages, informative_groups  # noqa: E402
from tracerl.training.distributed import World, all_gather, init_world, shutdown  # noqa: E402
from tracerl.training.fsdp import full_tensor, local_numel  # noqa: E402
from tracerl.training.run import build_trainer  # noqa: E402
from tracerl.training.sequences import training_sequence  # noqa: E402


@contextmanager
def serving(world: World, base: str):
    """`tracerl serve` of `base` in rank 0's process (one request at a time); its URL on every rank."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    thread = served = None
    if world.is_main:
        model, tok = load_model(base)
        served = LocalPolicy(model, tok, logprobs_mode="processed_logprobs")
        thread = ServerThread(served, max_batch_size=1).__enter__()
    try:
        yield all_gather(world, thread.base_url if thread else None)[0], served
        all_gather(world, None)  # rank 0 serves until every rank is done
    finally:
        if thread is not None:
            thread.__exit__(None, None, None)


def same_batch(base: str, out: Path) -> None:
    import tracerl.training.loss as loss

    world = init_world()
    loss.LOGITS_CHUNK_ELEMENTS = 4 * 300  # the output head over chunks of 4 tokens (the tiny vocabulary: 300)
    cfg = config(1).model_copy(update={"num_iterations": 1, "beta": 0.04, "shard": "fsdp2"})
    single = build_trainer(cfg.model_copy(update={"shard": "none"}), base, LetterEnv, out / "single", world=World())
    sample = single.sample_step(1)  # the same seeded rollouts on every rank (one process each)
    rewards = torch.tensor([[t.reward for t in g] for g in sample.groups], dtype=torch.float64)
    adv, keep = group_advantages(rewards), informative_groups(rewards)
    seqs = [training_sequence(t, float(adv[g, i]), single._hint_free_prompt(t), single.render_prompt)
            for g in range(len(sample.groups)) if keep[g] for i, t in enumerate(sample.groups[g])]
    seqs = seqs[: len(seqs) - 1 + len(seqs) % 2]  # an odd count 2k + 1: the ranks get k + 1 and k sequences …
    assert len(seqs) >= 3 and any(s.hinted for s in seqs), (len(seqs), "need hinted rollouts and 3 sequences")
    cfg = cfg.model_copy(update={"per_device_train_batch_size": len(seqs) // 2})  # … so 2 and 1 micro-batches
    single.cfg = cfg.model_copy(update={"shard": "none"})
    with serving(world, base) as (url, _):
        sharded = build_trainer(cfg, base, LetterEnv, out / "fsdp2", world=world, server_url=url)
    assert sharded.sharded
    before = torch.cat([p.detach().flatten() for p in single.params])
    single.update(copy.deepcopy(seqs))
    sharded.update(seqs)
    grad = torch.cat([full_tensor(p.grad).flatten() for p in sharded.params])
    ref_grad = torch.cat([p.grad.flatten() for p in single.params])
    mine = torch.cat([full_tensor(p.detach()).flatten() for p in sharded.params])
    ref = torch.cat([p.detach().flatten() for p in single.params])
    frozen = [p for p in sharded.model.parameters() if not p.requires_grad]
    shares = all_gather(world, {"base_local": local_numel(frozen), "adapter_local": local_numel(sharded.params)})
    if world.is_main:
        report = {
            "sequences": len(seqs), "micro_batches": [-(-len(World(r, world.size).chunk(seqs)) // cfg.per_device_train_batch_size)
                                                      for r in range(world.size)],
            "grad_max_abs_diff": (grad - ref_grad).abs().max().item(), "grad_max_abs": ref_grad.abs().max().item(),
            "grad_allclose_rtol_1e-4": torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-8),
            "param_max_abs_diff": (mine - ref).abs().max().item(), "param_moved": (ref - before).abs().max().item(),
            "learning_rate": cfg.learning_rate,
            "base_total": sum(p.numel() for p in single.model.parameters() if not p.requires_grad),
            "adapter_total": sum(p.numel() for p in single.params), "ranks": shares,
        }
        (out / "same-batch.json").write_text(json.dumps(report, indent=2))
    shutdown(world)


def train(base: str, out: Path, shard: str, steps: int, resume: bool) -> None:
    world = init_world()
    cfg = config(steps).model_copy(update={"shard": shard})
    with serving(world, base) as (url, _):
        build_trainer(cfg, base, LetterEnv, out, world=world, server_url=url, served_model="letters").train(resume=resume)
    shutdown(world)


def server(base: str, out: Path) -> None:
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    world = init_world()
    cfg = config(2).model_copy(update={"shard": "fsdp2", "num_iterations": 1})
    with serving(world, base) as (url, served):
        trainer = build_trainer(cfg, base, LetterEnv, out / "run", world=world, server_url=url, served_model="letters")
        rows = trainer.train()
        if world.is_main:
            on_server = get_peft_model_state_dict(served.model, adapter_name="letters")
            saved = load_file(str(out / "run" / "adapter_model.safetensors"))
            (out / "server.json").write_text(json.dumps({
                "swaps": trainer.backend.swaps, "rows": rows,
                "served_equals_saved": saved.keys() == on_server.keys()
                and all(torch.equal(saved[k], on_server[k]) for k in saved),
                "served_check_difference": trainer.backend.check.last_difference,
                "trained": any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k),
            }, indent=2))
    shutdown(world)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("out", type=Path)
    ap.add_argument("mode", choices=["same-batch", "train", "server"])
    ap.add_argument("--shard", default="fsdp2")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    if args.mode == "same-batch":
        same_batch(args.base, args.out)
    elif args.mode == "server":
        server(args.base, args.out)
    else:
        train(args.base, args.out, args.shard, args.steps, args.resume)


if __name__ == "__main__":
    main()
