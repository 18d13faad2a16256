"""Reference policies: the oracle passes every test task; the flawed policy's failures have the mix its rates imply."""

import json
import math
import re

import pytest

from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.envs.airline import AirlineEnv, generate_task, task_seeds
from tracerl.envs.airline.reference import DATE_QUESTION, FAULTS, PAYMENT_QUESTION, ScriptedAirlinePolicy
from tracerl.core.policy import Session
from tracerl.envs.registry import make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.models import factory


def make_policy(spec: str, **options):
    """A policy by spec, the airline's reference policies among them."""
    return factory.make_policy(spec, make_env=lambda: make_env("airline"), **options)


def _run(spec: str, seeds: list[int], seed: int = 0, batch_size: int = 64):
    return rollout(lambda: make_env("airline"), make_policy(spec, seed=seed), [Episode(seed=s) for s in seeds],
                   batch_size=batch_size)


def test_oracle_passes_200_of_200_test_tasks():
    trajectories = _run("oracle", task_seeds("test", 200))
    assert [t.reward for t in trajectories] == [1.0] * 200
    assert all(t.termination == "user_stop" and "faults" not in t.info for t in trajectories)


def test_episodes_have_a_models_shape():
    """One tool call (with an id) or one text per assistant turn; every call answered by a tool message."""
    for t in _run("flawed:0.3,0.3,0.3,0.3", task_seeds("train", 40)):
        answered = {m.tool_call_id for m in t.messages if m.role == "tool"}
        for m in t.messages:
            if m.role == "assistant":
                assert (m.content is None) != (m.tool_calls is None)
                assert all(c.id in answered for c in (m.tool_calls or []))
        assert t.info["task_kind"] and "gold_actions" in t.info and "reasoning_args" in t.info


def test_the_payment_id_is_asked_for_right_before_the_write_that_charges_it():
    """After the user confirms a write with a payment id, the oracle asks which payment method to use
    and writes the id the user answers: the copy's source is the message just before the write."""
    writes = 0
    for t in _run("oracle", task_seeds("train", 40)):
        for i, m in enumerate(t.messages):
            payment = m.tool_calls and m.tool_calls[0].parsed_arguments().get("payment_id")
            if payment:
                writes += 1
                assert t.messages[i - 4].content.endswith("Do you confirm?")
                assert [x.content for x in t.messages[i - 3: i]] == ["yes", PAYMENT_QUESTION, f"Please use {payment}."]
    assert writes >= 10


def test_the_date_is_asked_for_right_before_a_flight_search():
    """The oracle asks the date right before each flight search and searches the date the user answers."""
    searches = 0
    for t in _run("oracle", task_seeds("train", 40)):
        for i, m in enumerate(t.messages):
            if m.tool_calls and m.tool_calls[0].name == "search_direct_flight":
                searches += 1
                date = m.tool_calls[0].parsed_arguments()["date"]
                assert [x.content for x in t.messages[i - 2: i]] == [DATE_QUESTION, f"On {date}."]
    assert searches >= 5


def _handled(task, drawn):
    subs = task.subtasks
    return subs[:1] if "stop_early" in drawn and len(subs) > 1 else subs


def _applicable(task, fault, drawn) -> bool:
    """Whether a drawn fault can change this task's outcome (written independently of the policy)."""
    subs, handled = task.subtasks, _handled(task, drawn)
    if fault == "skip_precondition":
        return any(not s.allowed for s in handled)
    if fault == "stop_early":
        return len(subs) > 1 and any(s.writes or s.communicate for s in subs[1:])
    if fault == "mispick":  # a different write, or an amount nothing else in the script states
        others = lambda i: [s.say for j, s in enumerate(handled) if j != i]  # noqa: E731
        return any(s.allowed and s.mispick_writes is not None and (s.mispick_writes != s.writes or not any(
            re.search(rf"(?<![\w]){c}(?![\w])", text) for c in s.communicate for text in others(i)))
            for i, s in enumerate(handled))
    return any(s.allowed for s in handled)


def _within(count: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(max(n * p * (1 - p), 1e-9)) + 1e-9


def test_flawed_failure_mix_matches_the_planted_rates():
    rates = (0.3, 0.25, 0.2, 0.15)
    seeds = task_seeds("test", 400)
    trajectories = _run("flawed:" + ",".join(map(str, rates)), seeds, seed=11)
    tasks = {s: generate_task(s) for s in seeds}
    for fault, p in zip(FAULTS, rates, strict=True):
        drawn = [t for t in trajectories if fault in t.info["faults"]["drawn"]]
        assert _within(len(drawn), len(trajectories), p), (fault, len(drawn))
        applicable = [t for t in trajectories if _applicable(tasks[t.seed], fault, t.info["faults"]["drawn"])]
        planted = [t for t in trajectories if fault in t.info["faults"]["planted"]]
        assert set(map(id, planted)) == {id(t) for t in applicable if fault in t.info["faults"]["drawn"]}
        assert _within(len(planted), len(applicable), p), (fault, len(planted), len(applicable))
        assert len(applicable) >= 60, (fault, len(applicable))  # every failure family is well represented
    for t in trajectories:  # an episode fails exactly when a fault was planted in it
        assert t.passed == (not t.info["faults"]["planted"]), t.task_id
    # the pass rate the rates imply, task by task (P(pass) summed over whether stop_early is drawn)
    probabilities = []
    for t in trajectories:
        task, p_pass = tasks[t.seed], 0.0
        for stop, weight in ((False, 1 - rates[1]), (True, rates[1])):
            drawn = ["stop_early"] if stop else []
            if stop and _applicable(task, "stop_early", drawn):
                continue
            survive = math.prod(1 - p for fault, p in zip(FAULTS, rates, strict=True)
                                if fault != "stop_early" and _applicable(task, fault, drawn))
            p_pass += weight * survive
        probabilities.append(p_pass)
    expected = sum(probabilities)
    sigma = math.sqrt(sum(q * (1 - q) for q in probabilities))
    passed = sum(t.passed for t in trajectories)
    assert abs(passed - expected) <= 4 * sigma, (passed, expected, sigma)


def _only(fault: str, seeds: list[int]):
    rates = ["1" if f == fault else "0" for f in FAULTS]
    return [t for t in _run("flawed:" + ",".join(rates), seeds) if t.info["faults"]["planted"]]


def _writes(t):
    kinds = t.tool_kinds()
    answers = {m.tool_call_id: m.content for m in t.messages if m.role == "tool"}
    return [(c, answers[c.id]) for c in t.tool_calls() if kinds[c.name] == "write"]


SEEDS = task_seeds("train", 150)


def test_skip_precondition_makes_forbidden_writes():
    planted = _only("skip_precondition", SEEDS)
    assert len(planted) >= 20
    ignored_kinds = set()
    for t in planted:
        made = [(c.name, c.parsed_arguments()) for c, _ in _writes(t)]
        ignored = {s.kind for s in generate_task(t.seed).subtasks
                   if not s.allowed and any((w.name, w.arguments) in made for w in s.anyway_writes)}
        assert ignored
        ignored_kinds |= ignored
        assert t.reward_breakdown["DB"] == 0.0
        # the rule is ignored, never the read: each reservation written was read before, as when allowed
        calls = t.tool_calls()
        for i, c in enumerate(calls):
            rid = c.parsed_arguments().get("reservation_id")
            if rid and c.name != "get_reservation_details":
                assert any(r.name == "get_reservation_details" and r.parsed_arguments() == {"reservation_id": rid}
                           for r in calls[:i]), (t.seed, c.name, rid)
    assert ignored_kinds == {"cancel", "change", "certificate"}


def test_the_rule_check_is_said_unless_the_episode_skips_the_rule():
    """With rule_check the teacher says each cancellation's and compensation's check before deciding;
    an episode that drew skip_precondition says none, on allowed requests too."""
    checks = {True: 0, False: 0}
    assert not any(m.content and m.content.startswith("Check:") for t in _run("oracle", task_seeds("train", 40))
                   for m in t.messages)  # only with rule_check
    policy = make_policy("flawed:0.5,0,0,0", seed=3, rule_check=True)
    for t in rollout(lambda: make_env("airline"), policy, [Episode(seed=s) for s in task_seeds("train", 200)]):
        task = generate_task(t.seed)
        skipped = "skip_precondition" in t.info["faults"]["drawn"]
        said = [m.content for m in t.messages if m.role == "assistant" and m.content and m.content.startswith("Check:")]
        expected = [] if skipped else [s.check for s in task.subtasks if s.check]
        assert len(said) == len(expected) and all(c.startswith(e) for c, e in zip(said, expected))
        checks[skipped] += any(s.check for s in task.subtasks)
    assert checks[True] > 20 and checks[False] > 20


def test_a_teacher_citing_values_says_the_cited_check():
    policy = make_policy("flawed:0.5,0,0,0", seed=3, rule_check=True, cite_values=True)
    cited = 0
    for t in rollout(lambda: make_env("airline"), policy, [Episode(seed=s) for s in task_seeds("train", 60)]):
        said = [m.content for m in t.messages if m.role == "assistant" and m.content and m.content.startswith("Check:")]
        expected = [] if "skip_precondition" in t.info["faults"]["drawn"] else [
            s.cited_check for s in generate_task(t.seed).subtasks if s.cited_check]
        assert len(said) == len(expected) and all(c.startswith(e) for c, e in zip(said, expected))
        cited += len(said)
    assert cited > 10
    with pytest.raises(InputError, match="cite_values needs rule_check"):
        make_policy("flawed:0.5", cite_values=True)



def test_stop_early_leaves_requests_undone():
    planted = _only("stop_early", SEEDS)
    assert len(planted) >= 10
    for t in planted:
        assert len(t.info["subtasks"]) > 1
        assert len(_writes(t)) < len(t.info["gold_actions"]) or t.reward_breakdown["COMMUNICATE"] == 0.0


def test_mispick_gets_a_reasoning_value_wrong():
    planted = _only("mispick", SEEDS)
    assert len(planted) >= 50
    for t in planted:
        gold = t.info["gold_actions"]
        made = [c.parsed_arguments() for c, _ in _writes(t)]
        wrong_arg = any(made[i].get(name) != gold[i]["arguments"][name] for i, name in t.info["reasoning_args"]
                        if i < len(made))
        assert wrong_arg or (t.reward_breakdown["COMMUNICATE"] == 0.0 and t.info["task_kind"] in ("cancel", "multi"))
        assert all(not text.startswith("Error:") for _, text in _writes(t))


def test_corrupt_argument_makes_one_write_fail():
    planted = _only("corrupt_argument", SEEDS)
    assert len(planted) >= 50
    for t in planted:
        errors = [c for c, text in _writes(t) if text.startswith("Error:")]
        assert len(errors) == 1 and t.reward_breakdown["DB"] == 0.0


def test_typos_change_one_character_of_the_same_kind():
    import random

    from tracerl.envs.airline.reference import _typo

    rng = random.Random(0)
    for value in ("wren_amber", "raj_ahmed_837", "HAT996"):
        for _ in range(20):
            new = _typo(value, {value}, rng)
            changed = [(a, b) for a, b in zip(value, new, strict=True) if a != b]
            assert len(changed) == 1
            a, b = changed[0]
            assert (a.isdigit(), a.isupper(), a.islower()) == (b.isdigit(), b.isupper(), b.islower())
            assert a.islower() == (value == "wren_amber")  # letters only when there is no digit or capital


def test_rollouts_do_not_depend_on_batching_and_follow_the_seed():
    seeds = task_seeds("train", 30)
    dump = lambda ts: [t.model_dump_json() for t in ts]  # noqa: E731
    a = _run("flawed", seeds, seed=4, batch_size=64)
    assert dump(a) == dump(_run("flawed", seeds, seed=4, batch_size=7))
    assert dump(a) != dump(_run("flawed", seeds, seed=5))


@pytest.mark.parametrize("spec, rates", [
    ("oracle", (0, 0, 0, 0)), ("flawed", (0.25, 0.25, 0.25, 0.25)), ("flawed:0.5", (0.5, 0, 0, 0)),
    ("flawed:0.1,0.2,0.3,0.4", (0.1, 0.2, 0.3, 0.4)), ("flawed:1,0,0,1", (1, 0, 0, 1)),
])
def test_policy_specs(spec, rates):
    policy = make_policy(spec, seed=3)
    assert isinstance(policy, Policy) and isinstance(policy, ScriptedAirlinePolicy)
    assert policy.rates == tuple(float(r) for r in rates) and policy.seed == 3


@pytest.mark.parametrize("spec, message", [
    ("flawed:1.5", "outside [0, 1]"), ("flawed:-0.1", "outside [0, 1]"), ("flawed:0.1,0.1,0.1,0.1,0.1", "at most 4"),
    ("flawed:x", "must be numbers"), ("flawed:nan", "outside [0, 1]"), ("oracle:1", "no parameters"),
    ("gpt", "not a reference policy of the airline domain"),
])
def test_bad_policy_specs_are_input_errors(spec, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_policy(spec)


def test_scripted_policies_play_airline_tasks_only():
    with pytest.raises(TypeError, match="airline environment's tasks"):
        ScriptedAirlinePolicy().act([Session(messages=[], tools=[], info={"task_id": "other-7"}, seed=7)])
    assert json.loads(json.dumps(AirlineEnv().reset(seed=1)[1]["gold_actions"]))


def test_make_env_errors_are_input_errors():
    assert make_env("airline", split="train").split == "train"
    with pytest.raises(InputError, match="unknown split 'dev'"):
        make_env("airline", split="dev")
    with pytest.raises(InputError, match="environment 'airline'"):
        make_env("airline", colour="blue")
    with pytest.raises(InputError, match="unknown environment 'retail'"):
        make_env("retail")


def test_scoped_faults_act_only_on_their_kind_and_always_the_same_way():
    policy = make_policy("flawed:1@cancel,0,1@change,1@bags", seed=3)
    assert policy.name == "flawed:1@cancel,0,1@change,1@bags"
    seeds = task_seeds("train", 300)
    trajectories = _run("flawed:1@cancel,0,1@change,1@bags", seeds)
    seen = {"forbidden_cancel": 0, "forbidden_other": 0, "bags": 0, "change": 0}
    for t in trajectories:
        task = generate_task(t.seed)
        calls = [c for m in t.messages if m.role == "assistant" for c in m.tool_calls or []]
        for sub in task.subtasks:
            wrote = [c for c in calls if c.name != "get_reservation_details" and c.name != "search_direct_flight"
                     and (c.parsed_arguments() or {}).get("reservation_id") == sub.reservation_id]
            if not sub.allowed and sub.kind == "cancel":
                seen["forbidden_cancel"] += 1
                assert wrote, t.seed  # the rule ignored
            elif not sub.allowed:
                seen["forbidden_other"] += 1
                assert not wrote and not any(c.name == "send_certificate" for c in calls if sub.kind == "certificate"), t.seed
            elif sub.kind == "bags" and wrote and sum(s.kind == "bags" for s in task.subtasks) == 1:
                seen["bags"] += 1
                args = wrote[0].parsed_arguments()
                assert args["total_baggages"] == f"{sub.writes[0].arguments['total_baggages']} bags"
                assert {k: v for k, v in args.items() if k != "total_baggages"} == {
                    k: v for k, v in sub.writes[0].arguments.items() if k != "total_baggages"}  # ids untouched
            elif sub.kind == "change" and sum(s.kind == "change" and s.allowed for s in task.subtasks) == 1:
                seen["change"] += 1
                assert [a.model_dump() for a in (sub.mispick_writes or [])] == [
                    {"name": c.name, "arguments": c.parsed_arguments()} for c in wrote], t.seed
    assert min(seen.values()) >= 10, seen
    planted = {f for t in trajectories for f in t.info["faults"]["planted"]}
    assert planted == {"skip_precondition", "mispick", "corrupt_argument"}


@pytest.mark.parametrize("spec, message", [
    ("flawed:1@refund", "scope is one of cancel, change, bags, certificate"),
    ("flawed:1,1@cancel", "p2 (stop early) takes no scope"),
])
def test_bad_scopes_are_refused(spec, message):
    with pytest.raises(InputError, match=re.escape(message)):
        make_policy(spec)
