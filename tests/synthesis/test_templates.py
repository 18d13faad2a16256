"""The four templates meet every requirement on the built-in airline domain and on retail's tools.json,
and their rewards give the hand-computed values for known behaviours."""

import copy
import json
import random

import pytest

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.envs.airline.policy import HINT
from tracerl.envs.synthetic.checks import play, validate_env
from tracerl.envs.synthetic.target import Target, tool_families
from tracerl.envs.synthetic.templates import TEMPLATES, template_for
from tracerl.envs.synthetic.templates.precondition import PreconditionVerificationEnv
from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv
from tracerl.envs.synthetic.templates.precision import ToolCallPrecisionEnv
from tracerl.envs.synthetic.templates.structured import StructuredDataReasoningEnv
from tracerl.envs.synthetic.values import sample_arguments


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("which", ["airline", "retail"])
def test_template_passes_every_check(name, which, request):
    target = request.getfixturevalue(which)
    cls = TEMPLATES[name]
    for difficulty in (0, 4):
        report = validate_env(lambda: cls(target, difficulty=difficulty), target.tools, seeds=range(20))
        assert report.passed, f"{name} on {which} at difficulty {difficulty}: {report.failures()}"
        assert report.get("oracle").detail == "oracle scores 1.0 on 20 seeds"


def test_tools_are_the_targets_own_schemas(retail, airline):
    for target in (retail, airline):
        for cls in TEMPLATES.values():
            env = cls(target, difficulty=1)
            assert [t.name for t in env.tools] == [t.name for t in target.tools]  # listed as the target lists them
            assert 3 <= len(env.task_tools()) <= 5
            for schema in env.tools:
                assert schema == target.tool(schema.name)  # verbatim: description, parameters, kind


def test_a_listed_tool_the_tasks_do_not_use_is_an_error_that_changes_nothing(airline):
    for cls in TEMPLATES.values():
        env = cls(airline, difficulty=1)
        env.reset(seed=3)
        records = copy.deepcopy(env._records)
        unused = [t.name for t in env.tools if t.name not in env.task_tools()]
        assert "search_direct_flight" in unused
        for i, name in enumerate(unused):
            arguments = sample_arguments(airline.tool(name), random.Random(i))
            out, *_ = env.step(Message.assistant(tool_calls=[ToolCall.make(name, arguments, f"c{i}")]))
            assert out[-1].content == f"Error: {name} is not available for this request", out[-1].content
        assert env._records == records


def test_families_pair_read_check_with_write_acts(retail, tau2_airline):
    fam = tool_families(retail.tools)[0]
    assert (fam.check.name, fam.id_param, fam.acts[0].name) == ("get_order_details", "order_id", "cancel_pending_order")
    assert {a.name for a in fam.acts} == {
        "cancel_pending_order", "modify_pending_order_payment", "return_delivered_order_items",
        "exchange_delivered_order_items", "modify_pending_order_items", "modify_pending_order_address"}
    fam = tool_families(tau2_airline.tools)[0]
    assert (fam.check.name, fam.acts[0].name) == ("get_reservation_details", "cancel_reservation")


def test_template_names_and_aliases():
    assert template_for("tool_calling_precision") is ToolCallPrecisionEnv
    assert template_for("Multi-Step Completion") is MultiStepCompletionEnv
    assert template_for("tone_and_empathy") is None


def test_difficulty_adds_steps(retail):
    for cls in TEMPLATES.values():
        lengths = [sum(len(cls(retail, difficulty=d).oracle(s)) for s in range(10)) for d in range(5)]
        assert lengths[4] > lengths[0], cls.capability
    with pytest.raises(ValueError):
        PreconditionVerificationEnv(retail, difficulty=5)


def _seed_of_kind(env, kind):
    return next(s for s in range(100) if env.reset(seed=s)[1]["task_kind"] == kind)


def test_precondition_rewards(retail):
    env = PreconditionVerificationEnv(retail, difficulty=1)
    allowed, forbidden = _seed_of_kind(env, "allowed"), _seed_of_kind(env, "forbidden")
    check, act = env.oracle(allowed)
    assert play(env, allowed, [check, act])[0] == 1.0
    assert play(env, allowed, [act])[0] == pytest.approx(0.7)  # acted right, without checking
    assert play(env, allowed, [act, check])[0] == pytest.approx(0.7)  # the read came too late
    assert play(env, allowed, [check])[0] == pytest.approx(0.3)  # checked, then did not act
    (check,) = env.oracle(forbidden)
    record_id = check.arguments["order_id"]
    wrong = Action(name="cancel_pending_order", arguments={"order_id": record_id, "reason": "no longer needed"})
    assert play(env, forbidden, [check])[0] == 1.0
    assert play(env, forbidden, [check, wrong])[0] == pytest.approx(0.3)  # checked, then acted anyway
    assert play(env, forbidden, [])[0] == pytest.approx(0.7)  # refused without checking
    typo = Action(name=wrong.name, arguments={**wrong.arguments, "order_id": record_id + "x"})
    assert play(env, forbidden, [check, typo])[0] == pytest.approx(0.3)  # tried to act; only the typo failed
    assert play(env, forbidden, [check, Action(name=wrong.name, arguments={"order_id": record_id})])[0] == pytest.approx(0.3)
    mangled = Action(name="cancel", arguments={"order_id": record_id})  # no such tool: only the typo kept the order
    assert play(env, forbidden, [check, mangled])[0] == pytest.approx(0.3)
    assert play(env, forbidden, [check, Action(name="get_user_details", arguments={"user_id": "x"})])[0] == 1.0  # a read
    check, act = env.oracle(allowed)
    typo = Action(name=act.name, arguments={**act.arguments, "order_id": check.arguments["order_id"] + "x"})
    assert play(env, allowed, [check, typo, act])[0] == 1.0  # a failed try, then the right write
    assert play(env, allowed, [check, typo])[0] == pytest.approx(0.7)  # right decision, mistyped id
    kinds = {env.reset(seed=s)[1]["task_kind"] for s in range(40)}
    assert kinds == {"allowed", "forbidden"}  # acting is right in some seeds, forbidden in others


def test_multi_step_rewards(retail):
    env = MultiStepCompletionEnv(retail, difficulty=2)  # 4 requests
    gold = env.oracle(3)
    assert len(gold) == 4
    assert play(env, 3, gold[:3])[0] == pytest.approx(0.75)
    assert play(env, 3, gold[:1])[0] == pytest.approx(0.25)
    extra = Action(name=gold[0].name, arguments={**gold[1].arguments, "order_id": gold[0].arguments["order_id"]})
    if extra.arguments != gold[0].arguments:
        assert play(env, 3, gold + [extra])[0] == pytest.approx(0.5)  # all done, one unasked write: halved
    typos = [Action(name=g.name, arguments={**g.arguments, "order_id": g.arguments["order_id"] + "x"}) for g in gold]
    assert play(env, 3, typos)[0] == pytest.approx(0.5)  # every request tried, none done
    assert play(env, 3, typos[:1] + gold[1:2])[0] == pytest.approx(0.5 * 2 / 4 + 0.5 * 1 / 4)
    same_tool = sum(g.name == gold[0].name for g in gold)
    assert play(env, 3, typos[:1])[0] == pytest.approx(0.5 / 4)  # one call tries one request, not every one of its tool
    assert play(env, 3, typos[:1] * 4)[0] == pytest.approx(0.5 * same_tool / 4)


def test_structured_rewards(retail):
    env = StructuredDataReasoningEnv(retail, difficulty=1)  # 3 records
    gold = env.oracle(0)
    reads, act = gold[:-1], gold[-1]
    assert len(reads) == 3
    assert play(env, 0, gold)[0] == 1.0
    assert play(env, 0, [act])[0] == pytest.approx(0.8)  # right record, nothing read
    other = next(r.arguments["order_id"] for r in reads if r.arguments["order_id"] != act.arguments["order_id"])
    wrong = Action(name=act.name, arguments={**act.arguments, "order_id": other})
    assert play(env, 0, reads + [wrong])[0] == pytest.approx(0.2)
    assert play(env, 0, reads[:2] + [act])[0] == pytest.approx(0.2 * 2 / 3 + 0.8)


def test_precision_rewards(retail):
    env = ToolCallPrecisionEnv(retail, difficulty=0)
    (gold,) = env.oracle(1)
    assert gold.name == "modify_pending_order_address" and len(gold.arguments) == 7
    typo = Action(name=gold.name, arguments={**gold.arguments, "city": gold.arguments["city"].lower()})
    assert play(env, 1, [typo])[0] == pytest.approx(6 / 7)
    assert play(env, 1, [typo, gold])[0] == 1.0  # the last write counts, as a database would
    assert play(env, 1, [gold, typo])[0] == pytest.approx(6 / 7)


def test_precision_asks_the_targets_bag_requests_with_the_counts_its_rules_compute(airline):
    import re

    from tracerl.envs.airline.policy import free_bags

    env = ToolCallPrecisionEnv(airline, difficulty=1)
    assert env.acts[0].name == "update_reservation_baggages" and env.target_requests
    kinds = [env.task(s).kind for s in range(100)]
    assert 0.35 < kinds.count("target-1-call") / 100 < 0.65  # half the tasks
    for seed in [s for s, k in enumerate(kinds) if k == "target-1-call"][:20]:
        task = env.task(seed)
        ((record_id, record),), (request,), (gold,) = task.records.items(), task.requests, task.gold
        added = int(re.search(r"add (\d+) checked bag", request).group(1))
        total = record["total_baggages"] + added
        free = free_bags(task.user_fields["membership"], record["cabin"], record["passengers"])
        assert gold.arguments == {"reservation_id": record_id, "total_baggages": total,
                                  "nonfree_baggages": max(0, total - free), "payment_id": gold.arguments["payment_id"]}
        assert gold.arguments["payment_id"] in request and task.rules == list(airline.rules)
    seed = kinds.index("target-1-call")
    (gold,) = env.oracle(seed)
    assert play(env, seed, [gold])[0] == 1.0
    counted = Action(name=gold.name, arguments={**gold.arguments, "nonfree_baggages": gold.arguments["nonfree_baggages"] + 1})
    assert play(env, seed, [counted])[0] == pytest.approx(0.75)  # one count mis-picked of four values


def test_user_answers_like_the_airline_user(airline):
    from tracerl.core.messages import Message

    env = PreconditionVerificationEnv(airline, difficulty=0)
    _, info = env.reset(seed=2)
    user_id = env._task.user_id
    out, *_ = env.step(Message.assistant("Hello! Please tell me your user id."))
    assert out[0].content == f"My user id is {user_id}."
    out, *_ = env.step(Message.assistant("Shall I proceed? Please confirm."))
    assert out[0].content == "yes"
    out, reward, terminated, _, _ = env.step(Message.assistant("Is there anything else?"))
    assert terminated and out[0].content == "No, thank you. Goodbye."


def test_requests_come_one_at_a_time_like_the_airline_users(airline):
    from tracerl.envs.registry import make_env

    airline_openings = [make_env("airline").reset(seed=s)[0][-1].content for s in range(8)]
    assert any(o.startswith("Hi! I have 2 requests. First, I want to ") for o in airline_openings)
    env = MultiStepCompletionEnv(airline, difficulty=0)
    messages, _ = env.reset(seed=3)
    first, second = env._task.requests
    assert messages[-1].content == f"Hi! I have 2 requests. First, I want to {first}."
    assert "ask the user for the next request" in messages[0].content
    assert env.step(Message.assistant("Sure."))[0][-1].content == f"First, I want to {first}."
    assert env.step(Message.assistant("Please tell me your next request."))[0][-1].content == f"Second, I want to {second}."
    said, _, terminated, _, _ = env.step(Message.assistant("Done. Please tell me your next request."))
    assert said[-1].content == "That is all. Goodbye." and terminated


def test_hint_goes_into_system_prompt_and_is_strippable(retail):
    env = StructuredDataReasoningEnv(retail, difficulty=2)
    plain, _ = env.reset(seed=4)
    hinted, info = env.reset(seed=4, options={"hint": True})
    assert env.hint(4) in hinted[0].content and env.hint(4) not in plain[0].content
    assert hinted[1] == plain[1] and info == env.reset(seed=4)[1]


def test_system_prompt_keeps_the_targets_format(airline, retail):
    from tracerl.envs.registry import make_env
    from tracerl.synthesis.target import split_prompt

    assert split_prompt("A.\nB.\nCancel: x.\nBags: y.\nEnd.") == (("A.", "B."), ("Cancel: x.", "Bags: y."), ("End.",))
    assert split_prompt("A.\nB.") == (("A.", "B."), (), ())
    real = make_env("airline").reset(seed=0)[0][0].content.splitlines()
    assert len(airline.preamble) >= 2 and airline.closing
    for cls in TEMPLATES.values():
        prompt = cls(airline, difficulty=1).reset(seed=0)[0][0].content.splitlines()
        assert prompt[:len(airline.preamble)] == list(airline.preamble) == real[:len(airline.preamble)]
        assert prompt[-1] == airline.closing[-1] == real[-1]
        # its own rules; the multi-step requests are the target's own, and so are their rules (and half the
        # precondition ones')
        target_rules = [line for line in prompt if line in airline.rules]
        task = cls(airline, difficulty=1).task(0)
        worded = cls is MultiStepCompletionEnv or task.kind.startswith("target-")
        assert target_rules == (list(airline.rules) if worded else [])
        prompt = cls(retail, difficulty=1).reset(seed=0)[0][0].content
        assert prompt.startswith("# Retail agent policy\n")
    assert [line.split(":")[0] for line in airline.rules] == ["Cancel", "Change flight", "Bags", "Compensation"]


def test_tool_results_take_the_targets_record_shape(airline, retail):

    from tracerl.core.messages import Message, ToolCall

    assert {"get_user_details", "get_reservation_details", "cancel_reservation"} <= set(airline.result_examples)
    env = StructuredDataReasoningEnv(airline, difficulty=0)
    env.reset(seed=3)
    task = env._task
    record_id = next(iter(task.records))
    calls = [ToolCall.make("get_user_details", {"user_id": task.user_id}, "c0"),
             ToolCall.make("get_reservation_details", {"reservation_id": record_id}, "c1")]
    user, reservation = (json.loads(env.step(Message.assistant(tool_calls=[c]))[0][0].content) for c in calls)
    # the target's fields (cabin, flights, payment history…) under the template's own values
    assert set(airline.result_examples["get_reservation_details"]) <= set(reservation)
    assert {k: reservation[k] for k in task.records[record_id]} == task.records[record_id]
    assert set(airline.result_examples["get_user_details"]) <= set(user)
    assert user["user_id"] == task.user_id and user["reservations"] == list(task.records)
    # a round trip through target.json keeps them; a tools.json target has none and answers as before

    assert Target.of_file(airline.file()).result_examples == airline.result_examples
    assert retail.result_examples is None


def test_request_examples_keep_requests_that_name_their_record_and_say_every_value():
    from tracerl.envs.synthetic.target import fill_request, request_parameters
    from tracerl.synthesis.target import request_examples

    cancel = {"name": "cancel_reservation", "arguments": {"reservation_id": "oak"}}
    bags = {"name": "update_reservation_baggages",
            "arguments": {"reservation_id": "oak", "total_baggages": 3, "payment_id": "gift_card_harp"}}
    certificate = {"name": "send_certificate", "arguments": {"user_id": "ada_lee_owl", "amount": 200}}
    record = {"reservation_id": "oak", "cabin": "business", "user_id": "ada_lee_owl"}
    gold = {"membership": "gold"}
    found = request_examples([
        ("cancel reservation oak because of my health", cancel, record, gold, True),
        ("cancel reservation oak because of my health", cancel, record, gold, True),  # kept once
        ("cancel reservation oak because of my health", cancel, {**record, "cabin": "economy"}, gold, False),
        ("soak reservation oak, oak!", cancel, record, gold, True),  # whole words only, every occurrence
        ("cancel my booking", cancel, record, gold, True),  # the record is not named: dropped
        ("add 1 checked bag to reservation oak, paid with gift_card_harp", bags, record, gold, True),  # a count
        ("add 1 checked bag to reservation oak", bags, record, gold, True),  # the payment is not said: dropped
        ("compensate me for reservation oak", certificate, record, gold, True),  # the user's id, an amount
        ("compensate me", certificate, record, gold, True),  # no record named: dropped
    ])
    health = "cancel reservation {reservation_id} because of my health"
    by_id = {"name": "cancel_reservation", "arguments": {"reservation_id": "{reservation_id}"}}
    assert found == {
        "cancel_reservation": [
            {"request": health, "record": record, "user": gold, "allowed": True, "write": by_id},
            {"request": health, "record": {**record, "cabin": "economy"}, "user": gold, "allowed": False, "write": by_id},
            {"request": "soak reservation {reservation_id}, {reservation_id}!", "record": record, "user": gold,
             "allowed": True, "write": by_id}],
        "update_reservation_baggages": [
            {"request": "add 1 checked bag to reservation {reservation_id}, paid with {payment_id}", "record": record,
             "user": gold, "allowed": True, "write": {"name": "update_reservation_baggages", "arguments": {
                 "reservation_id": "{reservation_id}", "total_baggages": 3, "payment_id": "{payment_id}"}}}],
        "send_certificate": [
            {"request": "compensate me for reservation {reservation_id}", "record": record, "user": gold, "allowed": True,
             "write": {"name": "send_certificate", "arguments": {"user_id": "{user_id}", "amount": 200}}}]}
    assert request_parameters(health) == {"reservation_id"}
    assert fill_request(health, {"reservation_id": "elm"}) == "cancel reservation elm because of my health"


def test_airline_request_examples_are_its_users_requests_on_their_records(airline):
    from tracerl.contracts import TargetFile
    from tracerl.envs.airline.policy import booked_within_24h

    # a flight change's flights and cabin are neither said nor computed numbers
    assert set(airline.request_examples) == {"cancel_reservation", "send_certificate", "update_reservation_baggages"}
    examples = airline.request_examples["cancel_reservation"]
    assert {e["allowed"] for e in examples} == {True, False}
    health = [e for e in examples if e["request"] == "cancel reservation {reservation_id} because of my health"]
    assert any(e["allowed"] and e["record"]["insurance"] == "yes" for e in health)  # insurance covers health

    def cancel_allowed(example):  # the policy's cancel rule, read off the record and the request's reason
        record, statuses = example["record"], [f["status"] for f in example["record"]["flights"]]
        covered = any(w in example["request"] for w in ("health", "weather"))
        return "landed" not in statuses and (booked_within_24h(record["created_at"]) or "cancelled" in statuses
                                             or record["cabin"] == "business" or record["insurance"] == "yes" and covered)

    assert all(e["allowed"] == cancel_allowed(e) for e in examples)
    assert Target.of_file(airline.file()).request_examples == airline.request_examples
    assert Target.of_file(airline.file()).rules == airline.rules
    data = airline.file().model_dump()
    del data["request_examples"], data["rules"]  # a target.json written before they existed
    assert Target.of_file(TargetFile.model_validate(data)).request_examples is None


def test_multi_step_asks_the_targets_requests_on_their_records(airline):
    denied = 0
    for seed in range(40):
        task = MultiStepCompletionEnv(airline, difficulty=1).task(seed)
        gold_ids = {g.arguments["reservation_id"] for g in task.gold}
        assert gold_ids and all(g.name == "cancel_reservation" for g in task.gold)
        for request, (record_id, record) in zip(task.requests, task.records.items()):
            matches = [e for e in airline.request_examples["cancel_reservation"]
                       if e["request"].replace("{reservation_id}", record_id) == request
                       and all(record.get(k) == v for k, v in e["record"].items() if k not in ("reservation_id", "user_id"))]
            assert matches, request
            # a request the target's rules forbid on its record has no gold write
            assert (record_id in gold_ids) == matches[0]["allowed"]
            denied += record_id not in gold_ids
    assert 0.25 < denied / 120 < 0.6  # the target's cancellations: 106 of 300 forbidden


def test_precondition_asks_the_targets_requests_decided_by_its_rules(airline, retail):
    env = PreconditionVerificationEnv(airline, difficulty=0)
    assert env.has_target_requests and env.acts[0].name == "cancel_reservation"
    kinds = []
    for seed in range(200):
        task = env.task(seed)
        kinds.append(task.kind)
        if not task.kind.startswith("target-"):  # the template's own condition
            assert task.rules == env.rules("cancel_reservation") and "status is 'active'" in task.rules[0]
            continue
        (record_id, record), (request,) = next(iter(task.records.items())), task.requests
        matches = [e for e in airline.request_examples["cancel_reservation"]
                   if e["request"].replace("{reservation_id}", record_id) == request
                   and all(record.get(k) == v for k, v in e["record"].items() if k not in ("reservation_id", "user_id"))]
        assert matches, request
        assert task.kind == ("target-allowed" if matches[0]["allowed"] else "target-forbidden")
        assert [g.name for g in task.gold] == ["get_reservation_details"] + ["cancel_reservation"] * (task.kind == "target-allowed")
        assert task.rules == list(airline.rules)  # the target's own rules decide
        assert task.hint == HINT  # the guidance an agent built with --hinted-share was shown
    target = [k for k in kinds if k.startswith("target-")]
    assert 0.4 < len(target) / 200 < 0.6  # half the tasks
    assert 0.35 < target.count("target-forbidden") / len(target) < 0.65  # each decision as often as the other
    forbidden = _seed_of_kind(env, "target-forbidden")
    (check,) = env.oracle(forbidden)
    cancel = Action(name="cancel_reservation", arguments=dict(check.arguments))
    assert play(env, forbidden, [check])[0] == 1.0
    assert play(env, forbidden, [check, cancel])[0] == pytest.approx(0.3)  # read, then cancelled what the rules forbid
    retail_env = PreconditionVerificationEnv(retail, difficulty=0)  # no users' words: the template's conditions only
    assert not retail_env.has_target_requests
    assert {retail_env.task(s).kind for s in range(40)} == {"allowed", "forbidden"}


def test_multi_step_records_and_answers_read_like_the_targets(airline, retail):

    from tracerl.core.messages import ToolCall

    env = MultiStepCompletionEnv(airline, difficulty=0)
    env.reset(seed=5)
    task, record_id = env._task, env._task.gold[0].arguments["reservation_id"]
    calls = [ToolCall.make("get_reservation_details", {"reservation_id": record_id}, "c0"),
             ToolCall.make("cancel_reservation", {"reservation_id": record_id}, "c1")]
    record, answer = (json.loads(env.step(Message.assistant(tool_calls=[c]))[0][0].content) for c in calls)
    # the target's fields only, the task's user as the record's user; the write answers as the target's does
    assert set(record) == set(airline.result_examples["get_reservation_details"])
    assert record["reservation_id"] == record_id and record["user_id"] == task.user_id
    assert answer == {"reservation_id": record_id, "status": "cancelled"}
    # a target without observed records or words: the template's own fields, requests after the tool's name
    env = MultiStepCompletionEnv(retail, difficulty=0)
    env.reset(seed=5)
    assert {"amount", "created_at", "flagged"} <= set(next(iter(env._task.records.values())))
    assert env._task.requests == [env.request_phrase(env.target.tool(g.name), g.arguments[env.id_param], g.arguments)
                                  for g in env._task.gold]
    assert env._task.requests[0].startswith(env._task.gold[0].name.split("_")[0])


def test_structured_criteria_use_fields_the_targets_records_have(airline, retail):
    kinds = {StructuredDataReasoningEnv(airline, difficulty=0).task(seed).kind for seed in range(20)}
    assert kinds == {"newest-of-2", "oldest-of-2"}  # airline reservations have created_at, no amount
    task = StructuredDataReasoningEnv(airline, difficulty=0).task(0)
    example = set(airline.result_examples["get_reservation_details"])
    assert all(set(r) <= example for r in task.records.values())
    kinds = {StructuredDataReasoningEnv(retail, difficulty=0).task(seed).kind.split("-")[0] for seed in range(20)}
    assert kinds == {"highest", "lowest", "newest", "oldest"}


def test_multi_step_scores_a_denied_request_by_the_write_not_made(airline):
    env = MultiStepCompletionEnv(airline, difficulty=1)
    seed = next(s for s in range(40) if len(env.task(s).gold) == 2)
    task = env.task(seed)
    denied = next(r for r in task.records if r not in {g.arguments["reservation_id"] for g in task.gold})
    forbidden = Action(name="cancel_reservation", arguments={"reservation_id": denied})
    # 2 of 3 requests have writes: both done → 1.0; the denied one cancelled too → 0, as on the target
    assert env.score(task, list(task.gold), list(task.gold)) == (
        1.0, {"tried": 1.0, "completed": 1.0, "unrequested_writes": 0.0, "denied_writes": 0.0})
    calls = [*task.gold, forbidden]
    assert env.score(task, calls, calls) == (
        0.0, {"tried": 1.0, "completed": 1.0, "unrequested_writes": 1.0, "denied_writes": 1.0})
    # a cancel of the denied record is not taken for a mistyped attempt at a pending one
    assert env.score(task, task.gold[:1] + [forbidden], task.gold[:1] + [forbidden])[1]["tried"] == 0.5
