"""Argument values shaped like the target's: codes of letters and digits, codes of words."""

import random

from tracerl.envs.airline.tasks import RESERVATION_ID
from tracerl.envs.synthetic.templates.precondition import PreconditionVerificationEnv
from tracerl.envs.synthetic.values import id_value, shaped_like, word_code


def test_shaped_like_keeps_separators_and_redraws_digits_and_bare_codes():
    rng = random.Random(0)
    user_id = shaped_like("sara_doe_496", rng)
    assert user_id[:9] == "sara_doe_" and user_id[9:].isdigit() and user_id != "sara_doe_496"
    code = shaped_like("ZFA04Y", rng)
    assert len(code) == 6 and code.isalnum() and code[3:5].isdigit()
    assert shaped_like("USA", rng) == "USA"


def test_word_codes_recombine_the_examples_words_by_position():
    examples = ["wren_amber", "oak_ruby", "pine_opal"]
    rng = random.Random(1)
    codes = {word_code(examples, rng) for _ in range(200)}
    assert all(c.split("_")[0] in {"wren", "oak", "pine"} and c.split("_")[1] in {"amber", "ruby", "opal"}
               for c in codes)
    assert len(codes) == 9  # every pair, not only the three examples
    assert word_code(["a_b"], random.Random(0)) == "a_b"
    assert id_value({}, "reservation_id", random.Random(2), {"reservation_id": examples}) in codes


def test_airline_target_codes_reach_the_synthetic_records(airline):
    assert all(RESERVATION_ID.fullmatch(v) for v in airline.value_examples["reservation_id"])
    env = PreconditionVerificationEnv(airline, difficulty=3)
    for seed in range(20):
        assert all(RESERVATION_ID.fullmatch(record_id) for record_id in env.task(seed).records)
