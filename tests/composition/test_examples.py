"""Gate-training examples: the label span is the episode's opening, the LM-loss mask the model's turns."""

from __future__ import annotations

from composition_helpers import toy_tokenizer

from tracerl.composition.examples import prompt_example, trajectory_example
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
