"""From trajectories to training sequences: hint stripping, padding into [batch, time] tables.

A trajectory's `TokenRecord` is the episode exactly as the model saw it while sampling. Its initial
prompt (`ids[:prompt_len]`: system + first user turn) may contain a hint; the training sequence
replaces that prompt by the hint-free one, templated the same way, and keeps everything after it:

    training ids = render_prompt(prompt without hint) + ids[prompt_len:]

so hint tokens never reach the model during the gradient step.

The ratio of a hinted rollout. Its sampler log-probs were taken *with* the hint in context. The
trainer replaces them, before the first optimisation pass, by the log-probs of the same tokens on
the hint-free context under the sampling weights (`GRPOTrainer._prepare_old_logprobs`), so the
importance ratio of a hinted rollout — like that of every other rollout — measures only how far the
update has moved the policy, and the clip range keeps its meaning as a trust region. (Using the
with-hint log-probs instead would make ρ = π(a | no hint) / π(a | hint), far from 1 exactly on the
tokens the hint made likely: with A > 0 their gradient would be scaled by ρ ≪ 1, with A < 0 clipped
to zero — the hint would teach little.)
The price is a known bias: hinted actions are trained as if the hint-free policy had sampled them,
which is the point of hints (TRACE: "stripped from the prompt before the gradient step").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import TokenRecord, Trajectory

RenderPrompt = Callable[[list[Message], list[ToolSchema]], list[int]]


@dataclass
class TrainSequence:
    """One rollout ready for the loss. `old_logprobs[i]` is meaningful where `mask[i] == 1`."""

    ids: list[int]
    old_logprobs: list[float]
    mask: list[int]
    advantage: float
    hinted: bool = False  # old_logprobs still belong to the hinted context: recompute before training

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.mask)


def strip_prompt(tokens: TokenRecord, prompt_ids: list[int]) -> TokenRecord:
    """`tokens` with its initial prompt replaced by `prompt_ids` (context: mask 0, log-prob 0)."""
    if any(tokens.mask[: tokens.prompt_len]):
        raise ValueError("the initial prompt of a TokenRecord must not take loss")
    n = len(prompt_ids)
    return TokenRecord(
        ids=list(prompt_ids) + tokens.ids[tokens.prompt_len:],
        logprobs=[0.0] * n + tokens.logprobs[tokens.prompt_len:],
        mask=[0] * n + tokens.mask[tokens.prompt_len:],
        prompt_len=n,
    )


def training_sequence(
    trajectory: Trajectory, advantage: float, hint_free_prompt: list[Message] | None, render_prompt: RenderPrompt
) -> TrainSequence:
    """The training sequence of one rollout; `hint_free_prompt` is given iff it was sampled with a hint."""
    tokens = trajectory.tokens
    if tokens is None:
        raise ValueError(f"trajectory {trajectory.task_id} has no token record: sample with a model policy")
    hinted = hint_free_prompt is not None
    if hinted:
        tokens = strip_prompt(tokens, render_prompt(hint_free_prompt, trajectory.tools))
    return TrainSequence(list(tokens.ids), list(tokens.logprobs), list(tokens.mask), float(advantage), hinted)


@dataclass
class Batch:
    """Right-padded tables of a micro-batch."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (self.ids, self.attention_mask, self.loss_mask, self.old_logprobs,
                                               self.advantages)))


def collate(sequences: Sequence[TrainSequence], pad_id: int = 0) -> Batch:
    """Pad on the right to the longest sequence; padding takes no attention and no loss."""
    width = max(len(s.ids) for s in sequences)
    n = len(sequences)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(sequences):
        k = len(s.ids)
        ids[i, :k] = torch.tensor(s.ids)
        attn[i, :k] = 1
        mask[i, :k] = torch.tensor(s.mask, dtype=torch.float32)
        old[i, :k] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)
    return Batch(ids, attn, mask, old, adv)


def micro_batches(sequences: Sequence[TrainSequence], max_sequences: int,
                  max_tokens: int | None = None) -> list[list[TrainSequence]]:
    """`sequences` cut, in order, into micro-batches of at most `max_sequences` sequences and, with
    `max_tokens`, at most that many padded tokens (sequences × the longest one's length); a sequence
    longer than `max_tokens` is a micro-batch of its own. In order, so a micro-batch holds whole
    groups where it can (their shared prompt runs once)."""
    out: list[list[TrainSequence]] = []
    current: list[TrainSequence] = []
    longest = 0
    for s in sequences:
        width = max(longest, len(s.ids))
        if current and (len(current) >= max_sequences or (max_tokens is not None and (len(current) + 1) * width > max_tokens)):
            out.append(current)
            current, width = [], len(s.ids)
        current.append(s)
        longest = width
    if current:
        out.append(current)
    return out
