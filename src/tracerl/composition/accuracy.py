"""Routing accuracy on held-out prompts: does the composition send each environment's task to its adapter?

A prompt is the opening of an episode (system prompt + first user turn) labelled with the
capability of the environment it came from.

- moe: per-token majority (`prompt_slot`). Each token of the first user turn onward (the label
  mask) routes once per decoder layer; the token's slot is the one most of its layers chose (a
  tie goes to the deepest layer's choice among the tied: it has seen the most context), and the
  prompt's slot is the one most of its tokens chose (a tie goes to the lower slot). Pooling the
  layer × token decisions instead lets the first layer outvote the rest: its gate reads the token
  embedding alone, so the same token routes the same way in every task (benchmarks/README.md,
  "Composition"). A moe composition routed at the opening serves each episode with this slot.
- router / merge: the prediction is the router's most probable label (slot 0 = base).

Accuracy is reported overall and per capability.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from tracerl.composition.composed import Composition
from tracerl.composition.examples import GateExample, opening_example_from_ids, prompt_example
from tracerl.composition.training import pad_batch
from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory


@dataclass
class LabelledPrompt:
    messages: list[Message]
    tools: list[ToolSchema]
    capability: str


def prompts_from_trajectories(trajectories: list[Trajectory]) -> list[LabelledPrompt]:
    return [LabelledPrompt(t.messages, t.tools, str(t.info.get("capability"))) for t in trajectories]


def predicted_slots(composition: Composition, tokenizer, prompts: list[LabelledPrompt], batch_size: int = 16) -> list[int]:
    """The slot each prompt is routed to (see the module docstring)."""
    if composition.mode == "moe":
        return [prompt_slot(v) for v in gate_votes(composition, tokenizer, prompts, batch_size)]
    predictions: list[int] = []
    for start in range(0, len(prompts), batch_size):
        with torch.no_grad():
            alpha = composition.router.alphas([p.messages for p in prompts[start : start + batch_size]])
        predictions.extend(int(s) for s in alpha.argmax(dim=-1))
    return predictions


def gate_votes(composition: Composition, tokenizer, prompts: list[LabelledPrompt], batch_size: int = 16) -> list[torch.Tensor]:
    """moe: each prompt's routing decisions, (layers, tokens) slots over its label-masked tokens."""
    return example_votes(composition, [prompt_example(tokenizer, p.messages, p.tools, 0) for p in prompts], batch_size)


def opening_weights(composition: Composition, tokenizer, prompts: list[LabelledPrompt]) -> torch.Tensor:
    """moe routed at the opening: one-hot (batch, N+1) on each prompt's `prompt_slot`."""
    return _one_hot(composition, gate_votes(composition, tokenizer, prompts))


def opening_weights_for_ids(composition: Composition, tokenizer, prompts: list[list[int]]) -> torch.Tensor:
    """`opening_weights` of ChatML-rendered prompts given as token ids."""
    return _one_hot(composition, example_votes(composition, [opening_example_from_ids(tokenizer, ids) for ids in prompts]))


def _one_hot(composition: Composition, votes: list[torch.Tensor]) -> torch.Tensor:
    slots = torch.tensor([prompt_slot(v) for v in votes], dtype=torch.long)
    return torch.nn.functional.one_hot(slots, composition.num_slots).to(torch.float32)


@torch.no_grad()
def example_votes(composition: Composition, examples: list[GateExample], batch_size: int = 16) -> list[torch.Tensor]:
    """moe: the gates' per-token decisions on each example, (layers, tokens) slots over its label mask."""
    model = composition.model
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = pad_batch(chunk)
        was_training = model.training
        model.eval()
        try:
            with composition.routing() as call:
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device), use_cache=False)
        finally:
            model.train(was_training)
        votes = torch.stack(call.slots).cpu()  # (layers, batch, seq)
        mask = batch["label_mask"].bool() & batch["attention_mask"].bool()
        out.extend(votes[:, row][:, mask[row]] for row in range(len(chunk)))
    return out


def prompt_slot(votes: torch.Tensor) -> int:
    """Per-token majority over `votes` (layers, tokens) of slots; 0 when there are no tokens."""
    token_slots = []
    for column in votes.T.tolist():  # one token's choices, first layer to last
        counts = Counter(column)
        top = max(counts.values())
        token_slots.append(next(s for s in reversed(column) if counts[s] == top))
    counts = Counter(token_slots)
    return min(counts, key=lambda s: (-counts[s], s)) if counts else 0


def routing_accuracy(composition: Composition, tokenizer, prompts: list[LabelledPrompt], batch_size: int = 16) -> dict:
    """{"overall", "per_capability": {name: accuracy}, "num_prompts", "method"}; prompts of unknown capabilities raise."""
    truths = [composition.slot_of(p.capability) for p in prompts]
    predictions = predicted_slots(composition, tokenizer, prompts, batch_size)
    per: dict[str, list[bool]] = {}
    for p, truth, pred in zip(prompts, truths, predictions, strict=True):
        per.setdefault(p.capability, []).append(truth == pred)
    hits = [truth == pred for truth, pred in zip(truths, predictions, strict=True)]
    return {
        "overall": sum(hits) / len(hits) if hits else None,
        "per_capability": {name: sum(v) / len(v) for name, v in sorted(per.items())},
        "num_prompts": len(hits),
        "method": "per-token majority of the gates" if composition.mode == "moe" else "task router top-1",
    }
