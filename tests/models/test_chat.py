"""Multi-turn token bookkeeping: appended records vs a fresh templating of the same conversation."""

import json

from tracerl.core.messages import Message, ToolCall
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat
from tracerl.models.templates import QWEN3_TEMPLATE


def canonical_turn_ids(chat: ChatFormat, history, message, tools) -> list[int]:
    """The tokens a model writes when it writes exactly the template's rendering of `message`."""
    before = chat.render(history, tools, add_generation_prompt=True)
    after = chat.render(history + [message], tools, add_generation_prompt=False)
    assert after.startswith(before)
    body = after[len(before):]
    body = body[: body.rindex(chat.end_of_turn) + len(chat.end_of_turn)]
    return chat.encode(body)


def play(chat: ChatFormat, toy, script, sampled=None):
    """Run a scripted conversation through prepare/record; `script` = [(assistant message, env replies)]."""
    tools = toy.StoreEnv().tools
    session = Session(messages=[Message.system(toy.SYSTEM), Message.user("Please set the price of A1 to 12.")], tools=tools)
    turns = []
    for k, (reply, env_messages) in enumerate(script):
        chat.prepare(session)
        ids = sampled[k] if sampled else canonical_turn_ids(chat, session.messages, reply, tools)
        logprobs = [-0.5 - 0.01 * i for i in range(len(ids))]
        start = len(session.tokens.ids)
        parsed = chat.record(session, ids, logprobs)
        turns.append((start, ids, logprobs, parsed))
        session.messages.append(parsed.message)
        session.messages.extend(env_messages)
    return session, turns


def call(name, args, call_id):
    return ToolCall.make(name, args, call_id)


SCRIPT = [
    (Message.assistant(tool_calls=[call("get_price", {"item_id": "A1"}, "call_0")]),
     [Message.tool('{"item_id": "A1", "price": 6}', "call_0", "get_price")]),
    (Message.assistant(content="It costs 6. Shall I set it to 12?"), [Message.user("Yes, and A2 to 11.")]),
    (Message.assistant(content="Setting both.", tool_calls=[call("set_price", {"item_id": "A1", "price": 12}, "call_1"),
                                                            call("set_price", {"item_id": "A2", "price": 11}, "call_2")]),
     [Message.tool("ok", "call_1", "set_price"), Message.tool("ok", "call_2", "set_price")]),
    (Message.assistant(content="Done."), [Message.user("Thanks, bye.")]),
]


def test_record_equals_fresh_templating_for_a_prefix_preserving_template(tokenizer, toy):
    chat = ChatFormat(tokenizer)
    session, turns = play(chat, toy, SCRIPT)
    chat.prepare(session)  # appends the last user turn and the generation header
    fresh = chat.prompt_ids(session.messages, session.tools)
    assert session.tokens.ids == fresh
    # parsed replies are the scripted messages (ids included)
    assert [t[3].message for t in turns] == [s[0] for s in SCRIPT]
    # mask 1 and the sampling log-probs exactly on the sampled tokens, 0 elsewhere
    expected_mask = [0] * len(fresh)
    expected_lp = [0.0] * len(fresh)
    for start, ids, logprobs, _ in turns:
        assert session.tokens.ids[start:start + len(ids)] == ids
        expected_mask[start:start + len(ids)] = [1] * len(ids)
        expected_lp[start:start + len(ids)] = logprobs
    assert session.tokens.mask == expected_mask and session.tokens.logprobs == expected_lp
    # every sampled turn ends with the end-of-turn token, which takes loss
    assert all(ids[-1] == chat.end_of_turn_id for _, ids, _, _ in turns)
    initial = [Message.system(toy.SYSTEM), Message.user("Please set the price of A1 to 12.")]
    assert session.tokens.prompt_len == len(chat.prompt_ids(initial, session.tools))


def test_decode_encode_round_trip(tokenizer, toy):
    chat = ChatFormat(tokenizer)
    session, _ = play(chat, toy, SCRIPT)
    text = chat.render(session.messages, session.tools, add_generation_prompt=True)
    assert chat.decode(chat.encode(text)) == text


def test_qwen3_template_is_not_prefix_preserving_and_the_record_keeps_what_was_sampled(tokenizer, toy):
    qwen = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    qwen.chat_template = QWEN3_TEMPLATE
    chat = ChatFormat(qwen)
    thinking = Message.assistant(content="<think>\nA1 costs 6.\n</think>\n\nShall I set A1 to 12?")
    script = [(thinking, [Message.user("Yes.")]), (Message.assistant(content="Done."), [Message.user("Bye.")])]
    tools = toy.StoreEnv().tools
    # the model's own text, as it wrote it (think block included)
    sampled = [chat.encode(reply.content + chat.end_of_turn) for reply, _ in script]
    session, _ = play(chat, toy, script, sampled=sampled)
    chat.prepare(session)
    record_text = chat.decode(session.tokens.ids)
    fresh_text = chat.render(session.messages, tools, add_generation_prompt=True)
    assert "<think>\nA1 costs 6." in record_text  # what the model saw and wrote
    assert "<think>" not in fresh_text  # Qwen3 strips reasoning before the last user query
    assert record_text != fresh_text
    # the appended user turns are still exactly the template's text for them
    tail = "<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n"
    assert record_text.endswith("Done.<|im_end|>\n" + tail) and fresh_text.endswith("Done.<|im_end|>\n" + tail)


def test_a_turn_cut_by_the_token_budget_is_closed_as_context(tokenizer, toy):
    chat = ChatFormat(tokenizer)
    tools = toy.StoreEnv().tools
    session = Session(messages=[Message.system(toy.SYSTEM), Message.user("Hi")], tools=tools)
    chat.prepare(session)
    cut = chat.encode("It costs")  # no end-of-turn: max_new_tokens reached
    parsed = chat.record(session, cut, [-1.0] * len(cut))
    assert parsed.message.content == "It costs"
    session.messages += [parsed.message, Message.user("Go on.")]
    n = len(session.tokens.ids)
    chat.prepare(session)
    assert session.tokens.ids[n] == chat.end_of_turn_id and session.tokens.mask[n] == 0
    assert chat.decode(session.tokens.ids[n:]) == "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"
    assert session.tokens.ids == chat.prompt_ids(session.messages, tools)


def test_parsed_arguments_render_as_the_agent_wrote_them():
    """OpenAI clients (and vLLM's chat endpoint) hand earlier tool calls back with parsed arguments;
    the shipped template renders them as canonical JSON — the text tracerl keeps — so the prompt is
    the one tracerl renders from its own messages."""
    from tracerl.models.local import load_model

    _, tokenizer = load_model("tiny-agent")
    call = Message.assistant(None, [ToolCall.make("get_user_details", {"user_id": "emma_lopez_940", "a": [1, 2]}, "c1")])
    ours = [Message.user("hi").to_openai(), call.to_openai()]
    theirs = [ours[0], {**ours[1], "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                                  for c in ours[1]["tool_calls"]]}]
    assert isinstance(theirs[1]["tool_calls"][0]["function"]["arguments"], dict)
    rendered = [tokenizer.apply_chat_template(m, tokenize=False) for m in (ours, theirs)]
    assert rendered[0] == rendered[1] and '{"a":[1,2],"user_id":"emma_lopez_940"}' in rendered[0]
