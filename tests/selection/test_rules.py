"""The rules labeller on hand-made trajectories: each detector's NA / PRESENT / LACKING cases."""

from __future__ import annotations

from tracerl.contracts import Capability, default_rubric
from tracerl.selection.catalogue import builtin_capabilities
from tracerl.selection.rules import RulesLabeller

CAPS = builtin_capabilities()

RES = {"reservation_id": "ABC123"}
RES2 = {"reservation_id": "XYZ789"}
READ = ("call", "get_reservation_details", RES, '{"reservation_id": "ABC123", "cabin": "economy"}')
READ2 = ("call", "get_reservation_details", RES2, '{"reservation_id": "XYZ789"}')
FLIGHTS = {"reservation_id": "ABC123", "cabin": "economy", "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}], "payment_id": "credit_card_1"}


def labels(t, caps=CAPS, seed=0):
    return RulesLabeller().label([t], caps, seed)[0]


def lab(t, name):
    return labels(t)[name].label


def test_tool_call_precision(traj) -> None:
    gold = [("get_reservation_details", RES), ("cancel_reservation", RES)]
    good = traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=gold)
    assert lab(good, "tool_call_precision") == "PRESENT"
    typo = traj([READ, ("call", "cancel_reservation", {"reservation_id": "ABC12"}, "Error: reservation ABC12 not found")], gold=gold)
    out = labels(typo)["tool_call_precision"]
    assert out.label == "LACKING" and "turn 2" in out.evidence and "reservation_id" in out.evidence
    # a failing call on an invalid id, even without gold actions
    bad_id = traj([("call", "get_user_details", {"user_id": "nobody"}, "Error: user nobody not found")])
    assert lab(bad_id, "tool_call_precision") == "LACKING"
    # a gold call that fails by design is not an imprecision
    gold_err = traj([("call", "get_user_details", {"user_id": "nobody"}, "Error: user nobody not found")],
                    gold=[("get_user_details", {"user_id": "nobody"})])
    assert lab(gold_err, "tool_call_precision") == "PRESENT"
    unknown = traj([("call", "teleport", {}, "Error: unknown tool 'teleport'")])
    assert lab(unknown, "tool_call_precision") == "LACKING"
    assert lab(traj([("say", "I cannot help with that.")], gold=[]), "tool_call_precision") == "NA"


def test_multi_step_completion(traj) -> None:
    gold = [("get_reservation_details", RES), ("cancel_reservation", RES), ("get_reservation_details", RES2), ("cancel_reservation", RES2)]
    both = traj([READ, ("call", "cancel_reservation", RES, "{}"), READ2, ("call", "cancel_reservation", RES2, "{}")], gold=gold)
    assert lab(both, "multi_step_completion") == "PRESENT"
    first_only = traj([READ, ("call", "cancel_reservation", RES, "{}"), ("say", "Done!")], gold=gold)
    out = labels(first_only)["multi_step_completion"]
    assert out.label == "LACKING" and "1 of 2" in out.evidence
    # a wrong argument is attempted (precision), not an open sub-task
    typo = traj([READ, ("call", "cancel_reservation", RES, "{}"), READ2, ("call", "cancel_reservation", {"reservation_id": "XYZ78"}, "Error: not found")], gold=gold)
    assert lab(typo, "multi_step_completion") == "PRESENT" and lab(typo, "tool_call_precision") == "LACKING"
    single = traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=gold[:2])
    assert lab(single, "multi_step_completion") == "NA"
    assert lab(traj([READ]), "multi_step_completion") == "NA"  # no gold actions: unknown


def test_precondition_verification(traj) -> None:
    gold = [("get_reservation_details", RES), ("cancel_reservation", RES)]
    checked = traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=gold)
    assert lab(checked, "precondition_verification") == "PRESENT"
    unread = traj([("call", "cancel_reservation", RES, "{}")], gold=gold)
    out = labels(unread)["precondition_verification"]
    assert out.label == "LACKING" and "without reading" in out.evidence
    # the policy forbids the cancellation: gold has no write, the agent cancelled anyway
    forbidden = traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=[("get_reservation_details", RES)])
    out = labels(forbidden)["precondition_verification"]
    assert out.label == "LACKING" and "did not call for" in out.evidence
    refused = traj([READ, ("say", "This reservation cannot be cancelled.")], gold=[("get_reservation_details", RES)])
    assert lab(refused, "precondition_verification") == "NA"
    # a typo'd id on a write the task called for is precision, not a skipped check
    typo = traj([READ, ("call", "cancel_reservation", {"reservation_id": "ABC12"}, "Error: not found")], gold=gold)
    assert lab(typo, "precondition_verification") == "PRESENT"
    # without gold actions: reading the entity is what counts
    assert lab(traj([READ, ("call", "cancel_reservation", RES, "{}")]), "precondition_verification") == "PRESENT"
    assert lab(traj([READ2, ("call", "cancel_reservation", RES, "{}")]), "precondition_verification") == "LACKING"


def test_structured_data_reasoning(traj) -> None:
    gold = [("get_reservation_details", RES), ("search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"}),
            ("update_reservation_flights", FLIGHTS)]
    reasoning = [[2, "flights"]]
    steps = [READ, ("call", "search_direct_flight", gold[1][1], "[...]")]
    right = traj(steps + [("call", "update_reservation_flights", FLIGHTS, "{}")], gold=gold, reasoning_args=reasoning)
    assert lab(right, "structured_data_reasoning") == "PRESENT" and lab(right, "tool_call_precision") == "PRESENT"
    mispick = {**FLIGHTS, "flights": [{"flight_number": "HAT002", "date": "2024-05-20"}]}
    wrong = traj(steps + [("call", "update_reservation_flights", mispick, "{}")], gold=gold, reasoning_args=reasoning)
    out = labels(wrong)
    assert out["structured_data_reasoning"].label == "LACKING" and "HAT002" in out["structured_data_reasoning"].evidence
    assert out["tool_call_precision"].label == "PRESENT"  # the difference is only in a reasoning argument
    corrupt = {**FLIGHTS, "payment_id": "credit_card_9"}
    imprecise = traj(steps + [("call", "update_reservation_flights", corrupt, "{}")], gold=gold, reasoning_args=reasoning)
    assert lab(imprecise, "structured_data_reasoning") == "PRESENT" and lab(imprecise, "tool_call_precision") == "LACKING"
    # without reasoning_args (τ²-bench) any difference is precision
    plain = traj(steps + [("call", "update_reservation_flights", mispick, "{}")], gold=gold)
    assert lab(plain, "structured_data_reasoning") == "NA" and lab(plain, "tool_call_precision") == "LACKING"


def test_error_recovery(traj) -> None:
    assert lab(traj([READ]), "error_recovery") == "NA"
    recovered = traj([("call", "get_user_details", {"user_id": "sara"}, "Error: user not found"),
                      ("call", "get_user_details", {"user_id": "sara_doe_496"}, "{}")])
    assert lab(recovered, "error_recovery") == "PRESENT"
    stuck = traj([("call", "get_user_details", {"user_id": "sara"}, "Error: user not found"),
                  ("call", "get_user_details", {"user_id": "sara"}, "Error: user not found")])
    assert lab(stuck, "error_recovery") == "LACKING"
    assert lab(traj([("call", "calculate", {"expression": "1/0"}, "Error: division by zero")], termination="too_many_errors"),
               "error_recovery") == "LACKING"


def test_information_communication(traj) -> None:
    assert lab(traj([("say", "done")]), "information_communication") == "NA"
    told = traj([("say", "Your refund of $1,234.50 is on its way.")], communicate_info=["1234.50"])
    assert lab(told, "information_communication") == "PRESENT"
    silent = traj([("say", "Your refund is on its way.")], communicate_info=["1234.50"])
    assert lab(silent, "information_communication") == "LACKING"


def test_decoys_are_never_lacking(traj) -> None:
    rude = traj([("say", "wut. no. go away"), ("call", "cancel_reservation", RES, "{}")], gold=[])
    out = labels(rude)
    assert out["tone_and_empathy"].label == "PRESENT" and out["language_fluency"].label == "PRESENT"
    silent = labels(traj([READ]))
    assert silent["tone_and_empathy"].label == "NA" and silent["language_fluency"].label == "NA"


def test_deterministic_across_seeds_and_user_capabilities_unlabelled(traj) -> None:
    custom = Capability(name="upsell_skill", description="Offers insurance.", rubric=default_rubric("Offers insurance."), source="user")
    ts = [traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=[("cancel_reservation", RES)]), traj([("say", "hi")])]
    a = RulesLabeller().label(ts, CAPS + [custom], 0)
    b = RulesLabeller().label(ts, CAPS + [custom], 12345)
    assert a == b
    assert a[0]["upsell_skill"].label is None and "no detector" in a[0]["upsell_skill"].evidence
    assert all(set(row) == {c.name for c in CAPS} | {"upsell_skill"} for row in a)


CERT = ("call", "get_user_details", {"user_id": "u1"}, '{"membership": "gold"}')


def test_wrong_amount_told_is_reasoning_not_communication(traj) -> None:
    gold = [("send_certificate", {"user_id": "u1", "amount": 100})]
    steps = [CERT, READ, ("say", "I will send you a certificate of 50 dollars. Do you confirm?"), ("user", "yes"),
             ("call", "send_certificate", {"user_id": "u1", "amount": 100}, "{}")]
    t = traj(steps, gold=gold, communicate_info=["100"])
    out = labels(t)
    assert out["structured_data_reasoning"].label == "LACKING" and "50" in out["structured_data_reasoning"].evidence
    assert out["information_communication"].label == "PRESENT"
    right = traj([*steps[:2], ("say", "I will send you a certificate of $100. Do you confirm?"), *steps[3:]], gold=gold, communicate_info=["100"])
    assert lab(right, "structured_data_reasoning") == "PRESENT" and lab(right, "information_communication") == "PRESENT"
    # nothing told at all: a communication failure
    mute = traj([*steps[:2], ("say", "Shall I go ahead?"), *steps[3:]], gold=gold, communicate_info=["100"])
    assert lab(mute, "information_communication") == "LACKING" and lab(mute, "structured_data_reasoning") == "NA"


def test_items_of_requests_never_carried_out_are_multi_step(traj) -> None:
    gold = [("cancel_reservation", RES), ("cancel_reservation", RES2)]
    t = traj([READ, ("say", "The refund is 300 dollars. Confirm?"), ("call", "cancel_reservation", RES, "{}")],
             gold=gold, communicate_info=["300", "120"])
    out = labels(t)
    assert out["multi_step_completion"].label == "LACKING" and out["information_communication"].label == "PRESENT"
    assert out["structured_data_reasoning"].label == "PRESENT"


def test_a_write_on_another_real_entity_is_not_a_typo(traj) -> None:
    # the task cancels XYZ789 only; the agent also cancels ABC123 (forbidden) — not an imprecise call
    gold = [("cancel_reservation", RES2)]
    t = traj([READ, ("call", "cancel_reservation", RES, "{}")], gold=gold)
    out = labels(t)
    assert out["precondition_verification"].label == "LACKING" and "did not call for" in out["precondition_verification"].evidence
    assert out["tool_call_precision"].label == "PRESENT"
    # a mistyped id that names nothing is the gold write, imprecisely called
    typo = traj([READ2, ("call", "cancel_reservation", {"reservation_id": "XYZ7B9"}, "Error: reservation XYZ7B9 not found")], gold=gold)
    assert lab(typo, "tool_call_precision") == "LACKING" and lab(typo, "precondition_verification") == "PRESENT"


def test_a_malformed_reasoning_argument_is_precision(traj) -> None:
    gold = [("update_reservation_baggages", {"reservation_id": "ABC123", "total_baggages": 3, "nonfree_baggages": 1, "payment_id": "p"})]
    bad_type = {**gold[0][1], "nonfree_baggages": "1 bags"}
    t = traj([READ, ("call", "update_reservation_baggages", bad_type, "Error: invalid arguments: nonfree_baggages: not an integer")],
             gold=gold, reasoning_args=[[0, "total_baggages"], [0, "nonfree_baggages"]])
    out = labels(t)
    assert out["tool_call_precision"].label == "LACKING" and out["structured_data_reasoning"].label == "PRESENT"
