"""Routing accuracy on held-out prompts: does the composition send each environment's task to its adapter?

A prompt is the opening of an episode (system prompt + first user turn) labelled with the
capability of the environment it came from.

- moe: the gates' per-token majority over the opening (`tracerl.models.composed.composition.prompt_slot`),
  the slot a moe composition routed at the opening serves the episode with.
- router / merge: the prediction is the router's most probable label (slot 0 = base).

Accuracy is reported overall and per capability.
"""

from __future__ import annotations

from tracerl.core.trajectory import Trajectory
from tracerl.models.composed.composition import (
    Composition,
    LabelledPrompt,
    predicted_slots,
)


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


def prompts_from_trajectories(trajectories: list[Trajectory]) -> list[LabelledPrompt]:
    return [LabelledPrompt(t.messages, t.tools, str(t.info.get("capability"))) for t in trajectories]
