"""Train on LetterEnv from the command line (used by the resume and torchrun tests).

    python letters_run.py BASE OUT [--resume] [--steps N]
    torchrun --standalone --nproc_per_node=2 letters_run.py BASE OUT --check-ddp
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from training_helpers import LetterEnv  # noqa: E402

from tracerl.training.config import TrainConfig  # noqa: E402
from tracerl.training.distributed import World, all_gather, init_world, shutdown  # noqa: E402
from tracerl.training.run import build_trainer  # noqa: E402


def config(steps: int) -> TrainConfig:
    return TrainConfig(num_generations=4, groups_per_step=4, max_steps=steps, learning_rate=2e-2, rollout={"max_new_tokens": 6},
                       eval_episodes=4, eval_steps=2, hint_fraction=0.5, save_steps=1, num_iterations=2,
                       lora={"r": 4, "lora_alpha": 8}, seed=3)


def check_ddp(base: str, out: Path) -> None:
    """Sharded, all-reduced update == single-process update on the same batch; ranks stay identical."""
    world = init_world()
    cfg = config(1).model_copy(update={"num_iterations": 1})
    trainer = build_trainer(cfg, base, LetterEnv, out / "ddp", world=world)
    sample = trainer.sample_step(1)  # the same groups on every rank (all-gathered)
    from tracerl.training.advantages import group_advantages, informative_groups
    from tracerl.training.sequences import training_sequence

    rewards = torch.tensor([[t.reward for t in g] for g in sample.groups], dtype=torch.float64)
    adv, keep = group_advantages(rewards), informative_groups(rewards)
    seqs = [training_sequence(t, float(adv[g, i]), trainer._hint_free_prompt(t), trainer.render_prompt)
            for g in range(len(sample.groups)) if keep[g] for i, t in enumerate(sample.groups[g])]
    assert seqs, "no informative group"
    single = build_trainer(cfg, base, LetterEnv, out / "single", world=World())
    import copy

    single.update(copy.deepcopy(seqs))
    trainer.update(seqs)
    # the all-reduced gradient equals the whole-batch gradient (up to float summation order) …
    grad = torch.cat([p.grad.flatten() for p in trainer.params])
    ref_grad = torch.cat([p.grad.flatten() for p in single.params])
    assert ref_grad.abs().sum() > 0
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-8), (grad - ref_grad).abs().max().item()
    # … and so is the AdamW step (Adam magnifies float noise on near-zero gradients: tolerance ≪ lr)
    mine = torch.cat([p.detach().flatten() for p in trainer.params])
    ref = torch.cat([p.detach().flatten() for p in single.params])
    assert torch.allclose(mine, ref, atol=1e-2 * cfg.learning_rate), (mine - ref).abs().max().item()
    everyone = all_gather(world, mine)
    assert all(torch.equal(everyone[0], x) for x in everyone), "ranks diverged"
    if world.rank == 0:
        print("DDP-OK", len(seqs), "sequences")
    shutdown(world)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--check-ddp", action="store_true")
    args = ap.parse_args()
    if args.check_ddp:
        check_ddp(args.base, Path(args.out))
        return
    build_trainer(config(args.steps), args.base, LetterEnv, args.out).train(resume=args.resume)


if __name__ == "__main__":
    main()
