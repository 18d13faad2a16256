"""Group-relative advantages, as TRL's GRPOTrainer computes them.

    A_i = (r_i − mean_g) / (std + 1e-4)        std: of the group ("group"), of the whole batch ("batch")
    A_i =  r_i − mean_g                        ("none": Dr. GRPO's unscaled advantage)

`std` is torch's unbiased (Bessel-corrected) standard deviation, as in TRL. With "batch" the std is
over every rollout sampled for the step (constant groups included, as TRL's batch contains them).
"""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """Advantages of a [groups, generations] reward table (same shape)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError("rewards must be [groups, generations] with at least 2 generations")
    rewards = rewards.double()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_rewards == "none":
        return centred
    if scale_rewards == "group":
        std = rewards.std(dim=1, keepdim=True)
    elif scale_rewards == "batch":
        std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
    else:
        raise ValueError(f"scale_rewards must be group, batch or none, not {scale_rewards!r}")
    return centred / (std + ADVANTAGE_EPS)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Bool [groups]: True where the rewards of the group are not all equal (the group carries signal)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0
