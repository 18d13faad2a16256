"""Airline domain: policy rules, seeded tasks and splits, the scripted user, the τ²-style reward."""

import re

import pytest

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.envs.airline import POLICY, TEST_SEEDS, TRAIN_SEEDS, AirlineEnv, generate_task, split_of, task_seeds
from tracerl.envs.airline.env import replay
from tracerl.envs.airline.policy import (
    HINT, booked_within_24h, cancel_check, cancel_rule, compensation_check, compensation_rule, free_bags,
)
from tracerl.envs.airline.tasks import RESERVATION_ID
from tracerl.envs.airline.tools import AirlineTools
from tracerl.envs.airline.user import airline_user

from .test_airline_tools import _db


# --- rules -------------------------------------------------------------------------------------
def test_free_bag_table_is_tau2s():
    """τ²-bench's airline policy: regular 0/1/2, silver 1/2/3, gold 2/3/4 per passenger."""
    table = {m: [free_bags(m, c, 1) for c in ("basic_economy", "economy", "business")] for m in ("regular", "silver", "gold")}
    assert table == {"regular": [0, 1, 2], "silver": [1, 2, 3], "gold": [2, 3, 4]}
    assert free_bags("silver", "economy", 3) == 6


def test_24_hour_window_boundaries():
    assert booked_within_24h("2024-05-14 15:00")  # exactly 24 h before NOW
    assert not booked_within_24h("2024-05-14 14:59")
    assert booked_within_24h("2024-05-15 14:00")
    assert not booked_within_24h("2024-05-15 16:00")  # in the future: not a booking made in the last 24 h


def test_cancel_rules():
    db = _db()
    res = db.reservations["ABC123"]  # old, economy, no insurance, nothing cancelled
    assert cancel_rule(db, res, "health") == (False, "no cancellation rule applies")
    res.insurance = "yes"
    assert cancel_rule(db, res, "health")[0] and not cancel_rule(db, res, "change_of_plan")[0]
    res.insurance, res.cabin = "no", "business"
    assert cancel_rule(db, res, "change_of_plan")[0]
    res.cabin = "economy"
    db.flights["HAT200@2024-05-25"].status = "cancelled"
    assert cancel_rule(db, res, "change_of_plan") == (True, "the airline cancelled a flight")
    db.flights["HAT100@2024-05-20"].status = "landed"
    res.created_at = "2024-05-15 12:00"
    assert cancel_rule(db, res, "health") == (False, "a flight was already flown")  # flown beats every other rule


def test_compensation_rules():
    db = _db()
    user, res = db.users["mia_lee_123"], db.reservations["ABC123"]
    assert compensation_rule(db, user, res) == (False, "no flight was cancelled")
    db.flights["HAT100@2024-05-20"].status = "cancelled"
    assert compensation_rule(db, user, res)[0]  # silver
    user.membership = "regular"
    assert not compensation_rule(db, user, res)[0]
    res.insurance = "yes"
    assert compensation_rule(db, user, res)[0]


def test_rule_checks_answer_each_condition_up_to_the_deciding_one():
    db = _db()
    user, res = db.users["mia_lee_123"], db.reservations["ABC123"]  # old, economy, no insurance, nothing cancelled
    assert cancel_check(db, res, "health") == ("Check: flown no, booked in the last 24 hours no, cancelled by the airline no, "
                                              "business no, insured for the reason no.")
    res.insurance = "yes"
    assert cancel_check(db, res, "health").endswith("business no, insured for the reason yes.")
    assert cancel_check(db, res, "change_of_plan").endswith("insured for the reason no.")
    res.created_at = "2024-05-15 12:00"
    assert cancel_check(db, res, "health") == "Check: flown no, booked in the last 24 hours yes."
    db.flights["HAT100@2024-05-20"].status = "landed"
    assert cancel_check(db, res, "health") == "Check: flown yes."
    db = _db()
    user, res = db.users["mia_lee_123"], db.reservations["ABC123"]
    assert compensation_check(db, user, res) == "Check: a flight cancelled no."
    db.flights["HAT100@2024-05-20"].status = "cancelled"
    assert compensation_check(db, user, res) == "Check: a flight cancelled yes, silver or gold yes."
    user.membership = "regular"
    assert compensation_check(db, user, res) == "Check: a flight cancelled yes, silver or gold no, insured no, business no."


def test_a_cited_check_says_each_value_before_its_answer():
    db = _db()
    user, res = db.users["mia_lee_123"], db.reservations["ABC123"]  # old, economy, no insurance, nothing cancelled
    assert cancel_check(db, res, "change_of_plan", cite=True) == (
        f"Check: flown (available, available) no, booked in the last 24 hours ({res.created_at}) no, "
        "cancelled by the airline (available, available) no, "
        "business (economy) no, insured for the reason (no, change of plan) no.")
    res.created_at = "2024-05-15 12:00"
    assert cancel_check(db, res, "health", cite=True) == (
        "Check: flown (available, available) no, booked in the last 24 hours (2024-05-15 12:00) yes.")
    db.flights["HAT100@2024-05-20"].status = "cancelled"
    user.membership = "regular"
    assert compensation_check(db, user, res, cite=True) == (
        "Check: a flight cancelled (cancelled, available) yes, silver or gold (regular) no, insured (no) no, business (economy) no.")
    for seed in task_seeds("train", 100):  # the same answers as the plain check, each after its values
        for sub in generate_task(seed).subtasks:
            assert re.sub(r" \([^)]*\)", "", sub.cited_check) == sub.check



def test_every_rule_check_ends_in_its_requests_decision():
    """The last answer of a check decides as the rule does: a forbidding condition (flown, no flight
    cancelled) or every condition 'no' refuses; an allowing 'yes' allows."""
    checked = 0
    for seed in task_seeds("train", 300):
        for sub in generate_task(seed).subtasks:
            if sub.kind not in ("cancel", "certificate"):
                assert not sub.check
                continue
            last = sub.check.removeprefix("Check: ").rstrip(".").split(", ")[-1]
            forbids = last in ("flown yes", "a flight cancelled no") or last.endswith(" no")
            assert forbids == (not sub.allowed), (seed, sub.check, sub.rule)
            checked += 1
    assert checked > 100


def test_a_hinted_episode_has_the_guidance_and_nothing_else_differs():
    env = AirlineEnv()
    plain, _ = env.reset(seed=7)
    hinted, info = env.reset(seed=7, options={"hint": True})
    assert hinted[0].content == POLICY + "\n\n## Expert guidance\n" + HINT and hinted[1] == plain[1]
    assert env.hint(7) == HINT and info == env.reset(seed=7)[1]
    assert "_hint" not in env.reset(seed=7)[1]


def test_policy_text_states_the_numbers_the_code_uses():
    for fact in ("24 hours", "basic_economy 0, economy 1, business 2", "plus 1 for silver and 2 for gold", "costs 50",
                 "100 x passengers", "new flight's price per passenger", "ask the user for the next request", "2024-05-15 15:00"):
        assert fact in POLICY
    assert len(POLICY.split()) < 260


# --- tasks ---------------------------------------------------------------------------------------
def test_same_seed_same_task_and_seeds_differ():
    assert generate_task(123).model_dump_json() == generate_task(123).model_dump_json()
    assert generate_task(123).model_dump_json() != generate_task(124).model_dump_json()


def test_splits_are_disjoint_fixed_ranges():
    assert set(TRAIN_SEEDS).isdisjoint(TEST_SEEDS)
    assert task_seeds("test", 3) == [1_000_000, 1_000_001, 1_000_002]
    assert task_seeds("train", 2, offset=5) == [5, 6]
    assert split_of(7) == "train" and split_of(1_000_007) == "test" and split_of(500_000) is None
    with pytest.raises(ValueError):
        task_seeds("train", 10, offset=len(TRAIN_SEEDS) - 5)
    env = AirlineEnv(split="test")
    with pytest.raises(ValueError, match="not in the test split"):
        env.reset(seed=3)
    assert [t.name for t in env.tools]  # tools without a reset


def test_generated_tasks_are_consistent():
    """Over many seeds: every kind appears; gold writes all succeed; forbidden requests have no writes;
    reasoning args name real arguments; the mis-picked variant really differs from gold."""
    kinds, families = set(), {"forbidden": 0, "multi": 0, "reasoning": 0}
    tools = AirlineTools()
    for seed in range(300):
        task = generate_task(seed)
        kinds.add(task.task_kind)
        tools.bind(task.db.model_copy(deep=True))
        for action in task.gold_actions:
            assert not tools.call(action.name, action.arguments).startswith("Error:"), (seed, action)
        for sub in task.subtasks:
            assert (not sub.allowed) == (not sub.writes), seed
            if not sub.allowed:
                families["forbidden"] += 1
                assert sub.anyway_writes and sub.say.startswith("Sorry, I cannot")
            elif sub.kind == "cancel":
                assert sub.mispick_writes is None  # nothing to mis-pick
            else:
                assert sub.mispick_writes != sub.writes or sub.mispick_say != sub.say
        for index, name in task.reasoning_args:
            assert name in task.gold_actions[index].arguments
        families["reasoning"] += bool(task.reasoning_args)
        families["multi"] += len(task.subtasks) > 1
        assert 1 <= len(task.subtasks) <= 4
        assert task.user_id not in task.opening  # the agent has to ask for it
        for rid in task.db.reservations:
            assert RESERVATION_ID.fullmatch(rid), rid
        assert RESERVATION_ID.findall(task.opening) == [task.subtasks[0].reservation_id]  # one request at a time
        for sub in task.subtasks:  # no confirmation or refusal restates an id: the writes copy the user's
            said = " ".join(t for t in (sub.say, sub.mispick_say, sub.anyway_say) if t)
            assert not RESERVATION_ID.search(said) and task.user_id not in said, (seed, said)
            assert not any(p.payment_id in said for p in task.db.users[task.user_id].payment_methods), (seed, said)
            assert sub.payment is None or sub.payment in sub.request  # the request names its payment id
            if sub.kind in ("cancel", "change"):  # no refund or flight price read off a record to restate
                assert not sub.communicate and "dollars" not in said, (seed, said)
        assert all(len(r.payment_history) == 1 for r in task.db.reservations.values())  # one payment, refunded whole
        assert set(task.info()) == {"task_id", "task_kind", "gold_actions", "communicate_info", "reasoning_args", "subtasks"}
    assert kinds == {"cancel", "change", "bags", "certificate", "multi"}
    assert all(count >= 30 for count in families.values()), families


# --- user ----------------------------------------------------------------------------------------
def test_scripted_user_rules():
    single = _task_with(lambda t: t.task_kind == "cancel")
    multi = _task_with(lambda t: len(t.subtasks) == 2 and [s.kind for s in t.subtasks] == ["cancel", "bags"])
    user = airline_user(single)
    rid, reason = single.subtasks[0].reservation_id, single.subtasks[0].reason
    assert user.opening() == f"Hi! I want to {single.subtasks[0].request}."
    assert user.reply("Please tell me your user id.") == (f"My user id is {single.user_id}.", False)
    assert user.reply("I will cancel it. Do you confirm?") == ("yes", False)
    assert user.reply("What is the reservation id?") == (f"The reservation id is {rid}.", False)
    assert user.reply("What is the reason for the cancellation?") == (f"The reason is {reason}.", False)
    assert user.reply("Which payment method?") == (f"I want to {single.subtasks[0].request}.", False)  # none involved
    assert user.reply("Sorry, I cannot do that.") == ("I understand. Goodbye.", True)
    assert user.reply("Done. Is there anything else?") == ("No, thank you. Goodbye.", True)
    assert user.reply("The weather is nice.") == (f"I want to {single.subtasks[0].request}.", False)
    assert user.reply("Please tell me your next request.") == ("That is all. Goodbye.", True)

    cancel, bags = multi.subtasks
    other = airline_user(multi)
    assert other.opening() == f"Hi! I have 2 requests. First, I want to {cancel.request}."
    assert other.reply("Which reservation?") == (f"The reservation id is {cancel.reservation_id}.", False)
    assert other.reply("Which payment method should I use?") == (f"First, I want to {cancel.request}.", False)
    assert other.reply("Sorry, I cannot do that.") == ("OK, I understand.", False)
    assert other.reply("Sorry, I cannot do that. Please tell me your next request.") == (
        f"Second, I want to {bags.request}.", False)
    assert other.reply("Which payment method should I use?") == (f"Please use {bags.payment}.", False)
    assert other.reply("Which reservation?") == (f"The reservation id is {bags.reservation_id}.", False)
    assert other.reply("Sorry, I cannot do that.") == ("I understand. Goodbye.", True)
    assert other.reply("Please tell me your next request.") == ("That is all. Goodbye.", True)


# --- reward ---------------------------------------------------------------------------------------
def _play(env: AirlineEnv, seed: int, turns: list[Message]):
    env.reset(seed=seed)
    out = None
    for message in turns:
        out = env.step(message)
        if out[2] or out[3]:
            break
    return out


def _calls(actions: list[Action]) -> list[Message]:
    return [Message.assistant(tool_calls=[ToolCall.make(a.name, a.arguments, f"c{i}")]) for i, a in enumerate(actions)]


def _task_with(predicate):
    return next(generate_task(s) for s in range(500) if predicate(generate_task(s)))


def test_reward_is_db_match_times_communicated_info():
    task = _task_with(lambda t: t.task_kind == "certificate" and t.subtasks[0].allowed)
    env = AirlineEnv()
    said = Message.assistant(f"You get a certificate of {task.communicate_info[0]} dollars. Is there anything else?")
    mute = Message.assistant("Done. Is there anything else?")
    _, reward, terminated, _, info = _play(env, task.seed, [*_calls(task.gold_actions), said])
    assert terminated and reward == 1.0 and info["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    _, reward, _, _, info = _play(env, task.seed, [*_calls(task.gold_actions), mute])
    assert reward == 0.0 and info["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0}
    _, reward, _, _, info = _play(env, task.seed, [said])  # said it, did nothing
    assert reward == 0.0 and info["reward_breakdown"] == {"DB": 0.0, "COMMUNICATE": 1.0}
    # a failing call changes nothing; reads never count
    noisy = _calls([Action(name="cancel_reservation", arguments={"reservation_id": "NOPE00"}),
                    Action(name="get_user_details", arguments={"user_id": task.user_id}), *task.gold_actions])
    assert _play(env, task.seed, [*noisy, said])[1] == 1.0
    # an extra write the task did not ask for fails the DB check
    twice = _calls([*task.gold_actions, Action(name="cancel_reservation", arguments={"reservation_id": task.subtasks[0].reservation_id})])
    assert _play(env, task.seed, [*twice, said])[1] == 0.0


def test_forbidden_request_rewards_refusal_only():
    task = _task_with(lambda t: t.task_kind == "cancel" and not t.subtasks[0].allowed)
    env = AirlineEnv()
    _, reward, terminated, _, info = _play(env, task.seed, [Message.assistant(task.subtasks[0].say)])
    assert terminated and info["termination"] == "user_stop" and reward == 1.0
    assert _play(env, task.seed, [*_calls(task.subtasks[0].anyway_writes), Message.assistant("Done. Goodbye.")])[1] == 0.0


def test_replay_leaves_the_initial_db_untouched():
    task = _task_with(lambda t: len(t.gold_actions) >= 2)
    before = task.db.digest()
    assert replay(task.db, task.gold_actions) != before
    assert task.db.digest() == before
    assert replay(task.db, []) == before


def test_reset_info_and_truncation():
    env = AirlineEnv(max_turns=3)
    messages, info = env.reset(seed=5)
    assert [m.role for m in messages] == ["system", "user"] and messages[0].content == POLICY
    assert set(info) == {"task_id", "gold_actions", "communicate_info", "task_kind", "reasoning_args", "subtasks"}
    assert [a.model_dump() for a in env.oracle(5)] == info["gold_actions"]
    for _ in range(3):
        _, reward, terminated, truncated, step_info = env.step(Message.assistant("Hmm."))
    assert truncated and not terminated and reward == 0.0 and step_info["termination"] == "max_turns"


def test_transfer_ends_the_episode():
    env = AirlineEnv()
    env.reset(seed=5)
    call = Action(name="transfer_to_human_agents", arguments={"summary": "help"})
    _, _, terminated, _, info = env.step(_calls([call])[0])
    assert terminated and info["termination"] == "agent_stop"


def test_communicate_check_matches_whole_words():
    from tracerl.envs.airline.env import mentions

    assert mentions("The refund is $280.", "280") and mentions("You get 1,280 dollars back", "1280")
    assert mentions("REFUND: 280", "280")
    assert not mentions("Use gift_card_2801.", "280") and not mentions("You pay 1280 dollars", "280")
