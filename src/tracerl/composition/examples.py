"""Gate-training examples (`tracerl.models.composed.examples.GateExample`) from the adapters' trajectories.

From a trajectory with a `TokenRecord`, the ids and loss mask are the ones recorded while the
episode ran (the model's own tokens take LM loss). Without one, the conversation is templated
with the tokenizer's chat template and each assistant turn's tokens take LM loss.

The label mask covers the episode's opening from the first user turn on, up to the model's first
generated token: the task as the user states it, which is what routing accuracy is measured on.
The system prompt is shared by every environment of one target (interface-faithful synthesis), so
its tokens — identical and, the model being causal, with identical hidden states — cannot tell
capabilities apart. Later turns (tool calls, tool results, the scripted user's replies) look alike
across environments too: with them in the label mask a linear gate fits them and no longer tells
the openings apart (benchmarks/README.md, "Composition: routing and composed success"). They still
take the LM loss.
"""

from __future__ import annotations

from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.models.composed.examples import (
    GateExample,
    prompt_example,
    template_ids,
    user_turn_start,
)


def lacking_example(tokenizer: Any, trajectory: Trajectory, slots: list[int], num_slots: int) -> GateExample:
    """A target episode's opening, its target weight split evenly among `slots` (the capabilities
    the episode lacked): `prompt_example` with a `target` distribution."""
    if not slots:
        raise InputError(f"trajectory {trajectory.task_id}: no capability it lacked to route it to")
    example = prompt_example(tokenizer, trajectory.messages, trajectory.tools, slots[0])
    example.target = [slots.count(s) / len(slots) for s in range(num_slots)]
    return example


def trajectory_example(tokenizer: Any, trajectory: Trajectory, slot: int) -> GateExample:
    """One successful trajectory as a gate-training example (see the module docstring)."""
    if trajectory.tokens is not None and trajectory.tokens.ids:
        ids, loss_mask = list(trajectory.tokens.ids), list(trajectory.tokens.mask)
    else:
        ids, loss_mask = templated_with_assistant_mask(tokenizer, trajectory.messages, trajectory.tools)
    start = user_turn_start(tokenizer, trajectory.messages, trajectory.tools, ids)
    end = next((i for i, m in enumerate(loss_mask) if m and i >= start), len(ids))
    return GateExample(ids, loss_mask, [0] * start + [1] * (end - start) + [0] * (len(ids) - end), slot)


def templated_with_assistant_mask(tokenizer: Any, messages: list[Message], tools: list[ToolSchema]) -> tuple[list[int], list[int]]:
    """Template a whole conversation; mask = 1 on each assistant turn's tokens (prefix differences)."""
    ids = template_ids(tokenizer, messages, tools)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message.role != "assistant":
            continue
        before = template_ids(tokenizer, messages[:i], tools, generation_prompt=True)
        through = template_ids(tokenizer, messages[: i + 1], tools)
        if ids[: len(before)] != before or ids[: len(through)] != through:
            raise InputError("the chat template is not prefix-stable; gate training needs trajectories with token records")
        for j in range(len(before), len(through)):
            mask[j] = 1
    return ids, mask


def lm_kept(trajectories: list[Trajectory]) -> tuple[list[Trajectory], str]:
    """The trajectories of one capability whose tokens take the LM loss, and why: the successful
    ones, else (none succeeded) the best rewarded."""
    good = [t for t in trajectories if t.passed]
    if good or not trajectories:
        return good, "successful"
    best = max(t.reward for t in trajectories)
    return [t for t in trajectories if t.reward == best], f"best reward {best:.2f} (no success)"


def examples_from_trajectories(
    tokenizer: Any, trajectories: list[Trajectory], slot_of: dict[str, int], *, lm_on_all: bool = False
) -> list[GateExample]:
    """Examples from trajectories whose `info["capability"]` names a slot in `slot_of`.

    Every trajectory's opening takes the label loss: it states a task of its capability whether or
    not the adapter then solved it, so a capability whose adapter never succeeds is still routed.
    The LM loss goes to each capability's `lm_kept` trajectories (all of them with `lm_on_all`).
    """
    by_capability: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        capability = t.info.get("capability")
        if capability not in slot_of:
            raise InputError(f"trajectory {t.task_id} ({t.domain}) has capability {capability!r}, not one of {sorted(slot_of)}")
        by_capability.setdefault(capability, []).append(t)
    lm = {id(t) for group in by_capability.values() for t in (group if lm_on_all else lm_kept(group)[0])}
    examples = []
    for t in trajectories:
        example = trajectory_example(tokenizer, t, slot_of[t.info["capability"]])
        if id(t) not in lm:
            example.loss_mask = [0] * len(example.loss_mask)
        examples.append(example)
    return examples
