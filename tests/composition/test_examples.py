"""Gate-training examples: the label span is the episode's opening, the LM-loss mask the model's turns."""

from __future__ import annotations

import pytest
from composition_helpers import toy_tokenizer

from tracerl.composition.examples import examples_from_trajectories, trajectory_example

from tracerl.models.composed.examples import prompt_example
from tracerl.core.errors import InputError
from tracerl.core.messages import Message, ToolCall
from tracerl.core.trajectory import Trajectory


def conversation() -> list[Message]:
    return [
        Message.system("You are a support agent."),
        Message.user("please cancel reservation 12"),
        Message.assistant("", tool_calls=[ToolCall.make("cancel", {"id": "12"}, "call_0")]),
        Message.tool("cancelled", tool_call_id="call_0", name="cancel"),
        Message.user("thanks"),
        Message.assistant("done"),
    ]


def test_label_span_is_the_opening_the_routing_accuracy_is_measured_on():
    tokenizer = toy_tokenizer()
    messages = conversation()
    example = trajectory_example(tokenizer, Trajectory(task_id="t", domain="d", messages=messages), slot=2)
    opening = prompt_example(tokenizer, messages[:2], [], slot=2)
    labelled = [i for i, m in enumerate(example.label_mask) if m]
    # one contiguous span: the first user turn and the generation prompt, exactly as in the prompt
    assert labelled == list(range(labelled[0], labelled[-1] + 1))
    assert [example.input_ids[i] for i in labelled] == [t for t, m in zip(opening.input_ids, opening.label_mask) if m]
    assert example.input_ids[: len(opening.input_ids)] == opening.input_ids
    # the label span ends where the model's first generated token (the first LM-loss target) begins
    assert labelled[-1] + 1 == example.loss_mask.index(1)
    assert sum(example.loss_mask) > 0 and example.slot == 2


def test_every_opening_takes_the_label_and_the_lm_loss_goes_to_successes_else_the_best_rewarded():
    tokenizer = toy_tokenizer()

    def rollout(capability: str, reward: float) -> Trajectory:
        return Trajectory(task_id=f"{capability}-{reward}", domain="d", messages=conversation(), reward=reward,
                          info={"capability": capability})

    trajectories = [rollout("a", 1.0), rollout("a", 0.4), rollout("b", 0.2), rollout("b", 0.6), rollout("b", 0.6)]
    examples = examples_from_trajectories(tokenizer, trajectories, {"a": 1, "b": 2})
    assert [e.slot for e in examples] == [1, 1, 2, 2, 2]
    assert all(sum(e.label_mask) > 0 for e in examples)  # failed rollouts still teach the gates their task
    # a: its one success takes the LM loss; b never succeeded: its best-rewarded two do
    assert [sum(e.loss_mask) > 0 for e in examples] == [True, False, False, True, True]
    every = examples_from_trajectories(tokenizer, trajectories, {"a": 1, "b": 2}, lm_on_all=True)
    assert all(sum(e.loss_mask) > 0 for e in every)
    with pytest.raises(InputError, match="capability 'c'"):
        examples_from_trajectories(tokenizer, [rollout("c", 1.0)], {"a": 1})
