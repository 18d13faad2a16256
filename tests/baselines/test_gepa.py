"""GEPA as a baseline: the `gepa` package's own loop over tracerl's rollouts, with a real OpenAI-compatible
server as its reflection model (the tiny agent behind `tracerl serve`'s server, on loopback). Its proposals
are poor; what is checked is the loop, the rollout budget and what is evaluated."""

from __future__ import annotations

import pytest

from tracerl.baselines.config import GepaConfig
from tracerl.baselines.gepa import (
    RolloutAdapter, feedback, fits_another_iteration, opening, run_gepa, seed_prompt, transcript,
)
from tracerl.core.errors import InputError
from tracerl.core.messages import Message, ToolCall
from tracerl.core.trajectory import Trajectory
from tracerl.envs.airline import AirlineEnv
from tracerl.models.factory import make_policy
from tracerl.envs.runner import Episode, rollout

pytestmark = pytest.mark.timeout(1200)


def _trajectory(prompt: str = "Be exact.", reward: float = 0.5) -> Trajectory:
    return Trajectory(
        task_id="7", domain="airline", messages=[
            Message.system(prompt), Message.user("Cancel reservation ABC."),
            Message.assistant(None, [ToolCall.make("cancel_reservation", {"reservation_id": "ABC"}, "c1")]),
            Message.tool('{"status": "cancelled"}', "c1", "cancel_reservation"), Message.assistant("Done.")],
        reward=reward, passed=reward == 1.0, reward_breakdown={"db": 1.0, "communicate": 0.0}, termination="user_stop",
        info={"gold_actions": [{"name": "get_reservation_details", "arguments": {"reservation_id": "ABC"}}]})


def test_the_stopper_leaves_room_for_one_more_iteration():
    adapter = RolloutAdapter(lambda: AirlineEnv(), policy=None, budget=14, batch_size=4, transcript_chars=300)  # type: ignore[arg-type]
    stop = fits_another_iteration(adapter, minibatch=2, val_tasks=2)  # an iteration plays at most 2 + 2 + 2
    adapter.rollouts = 8
    assert not stop(None)  # 8 + 6 = 14: one more fits exactly
    adapter.rollouts = 9
    assert stop(None)  # 9 + 6 = 15 > 14
    with pytest.raises(RuntimeError, match="GEPA asked for 6 more rollouts with 5 left of its budget"):
        adapter.evaluate(list(range(6)), {"system_prompt": "x"})


def test_what_the_reflection_model_reads():
    t = _trajectory()
    assert opening(t) == "Cancel reservation ABC."
    assert transcript(t, 1000) == ('user: Cancel reservation ABC.\nagent: cancel_reservation({"reservation_id":"ABC"})\n'
                                   'tool cancel_reservation: {"status": "cancelled"}\nagent: Done.')
    assert transcript(t, 20) == "user: Cancel reserv…"
    assert feedback(t) == ('reward 0.5 (failed), ended by user_stop. reward parts: db 1, communicate 0. '
                           'expected calls: get_reservation_details({"reservation_id": "ABC"})')


def test_gepa_optimises_one_system_prompt():
    assert seed_prompt([_trajectory(), _trajectory()]) == "Be exact."
    with pytest.raises(InputError, match="open with 2 different ones"):
        seed_prompt([_trajectory(), _trajectory("Be quick.")])


class CountedAirline(AirlineEnv):
    """The airline domain, counting the episodes it starts (what GEPA consumed, counted independently)."""

    resets = 0

    def reset(self, seed=None, options=None):
        type(self).resets += 1
        return super().reset(seed=seed, options=options)


@pytest.fixture(scope="module")
def reflector():
    """The tiny agent behind the OpenAI API on loopback: GEPA's reflection model."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=2) as server:
        yield server.base_url


@pytest.mark.slow
def test_gepa_loop_within_its_budget(reflector):
    from tracerl.baselines.gepa import Reflection

    config = GepaConfig(train_tasks=4, val_tasks=2, reflection_minibatch_size=2, reflection_max_tokens=24,
                        transcript_chars=300)
    policy = make_policy("model", max_new_tokens=48)
    seed_text = AirlineEnv(split="train").reset(seed=0)[0][0].content
    with pytest.raises(InputError, match=r"a budget of 5 rollouts is less than one GEPA iteration needs .* = 6\)"):
        run_gepa(make_env=lambda: AirlineEnv(split="train"), policy=policy, config=config, budget=5,
                 reflection=None, seed_text=seed_text, seed=0, curve_seeds=[], batch_size=4)  # type: ignore[arg-type]
    reflection = Reflection(base_url=reflector, model="tiny-agent", api_key="none", temperature=1.0, max_tokens=24, seed=0)
    CountedAirline.resets = 0
    curve = [2, 5]  # validation episodes of the curve: GEPA neither trains nor selects on them
    result = run_gepa(make_env=lambda: CountedAirline(split="train"), policy=policy, config=config, budget=14,
                      reflection=reflection, seed_text=seed_text, seed=0, curve_seeds=curve, batch_size=4)
    print(f"\ngepa: {result.rollouts_used} of {result.budget} rollouts, {len(result.candidates)} candidates, "
          f"{result.reflection_calls} reflection calls\n{result.log}")
    # every episode GEPA played is counted (and the running-best prompts' curve episodes besides), the budget is
    # never passed, and GEPA stopped only when one more iteration (2 + 2 on a minibatch, then 2 validation tasks)
    # could have passed it
    running = [c for c in result.candidates[1:] if c.curve_episodes is not None]
    assert result.rollouts_used + len(curve) * len(running) == CountedAirline.resets
    assert result.rollouts_used <= 14 < result.rollouts_used + 6
    assert result.train_seeds == [0, 1, 3, 4] and result.val_seeds == [6, 7]
    seed = result.candidates[0]
    assert seed.prompt == seed_text and seed.parents == [] and seed.discovered_at == 0
    # the seed prompt's validation score is its mean reward on the validation tasks, played greedily
    replay = rollout(lambda: AirlineEnv(split="train"), make_policy("model", max_new_tokens=48),
                     [Episode(seed=s) for s in result.val_seeds])
    assert seed.val_score == pytest.approx(sum(t.reward for t in replay) / len(replay))
    assert result.reflection_calls >= 1 and "Iteration 1" in result.log
    assert all(c.discovered_at <= result.rollouts_used for c in result.candidates)
    scores = [c.val_score for c in result.candidates]
    assert result.best == scores.index(max(scores)) and result.best_prompt == result.candidates[result.best].prompt
    assert all(c.curve_episodes == len(curve) for c in running)
    assert result.curve_seeds == curve and result.optimizer == "gepa 0.1.4"
