"""The code domain's capability templates (validated, scored, calibrated) and rules selection on it."""

import collections

import pytest

from tracerl.core.messages import Message, ToolCall
from tracerl.envs.code.capabilities import CAPABILITY_ENVS, TestVerificationEnv
from tracerl.envs.code.sandbox import isolation
from tracerl.envs.registry import make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.synthetic.checks import validate_env
from tracerl.envs.synthetic.templates import template_class, template_for
from tracerl.models import factory
from tracerl.selection.stage import SelectConfig, run_select
from tracerl.synthesis.scripted import NoisyOraclePolicy
from tracerl.synthesis.synthesize import calibrate_env_dir, synthesize_capability
from tracerl.synthesis.target import load_target

pytestmark = pytest.mark.skipif(len(isolation()) < 2, reason="no user namespaces or Landlock on this kernel")


def make_policy(spec, **options):
    """A policy by spec, the code domain's reference policies included."""
    return factory.make_policy(spec, make_env=lambda: make_env("code"), **options)


@pytest.fixture(scope="module")
def target():
    return load_target("code")


def play(env, seed, calls):
    env.reset(seed=seed)
    out = None
    for i, (name, args) in enumerate(calls):
        out = env.step(Message.assistant(tool_calls=[ToolCall.make(name, args, f"c{i}")]))
    return out[1]


@pytest.mark.parametrize("capability", sorted(CAPABILITY_ENVS))
def test_templates_keep_the_targets_tools_and_validate(target, capability):
    cls = template_for(capability, target)
    assert template_for(capability) is None and template_for("multi_step_completion", target) is None
    assert cls is CAPABILITY_ENVS[capability] and template_class(capability) is cls
    env = cls(target, difficulty=1)
    assert [t.model_dump() for t in env.tools] == [t.model_dump() for t in target.tools]
    report = validate_env(lambda: cls(target, difficulty=1), target.tools, seeds=range(5))
    assert report.passed, report.failures()


def test_the_seed_gives_a_capability_task_to_its_reference_policies(target):
    """A capability environment's task family is fixed when it is made, so its reference policies regenerate
    each task from the episode's seed alone; its hint is its own guidance, stripped by a plain reset."""
    env = CAPABILITY_ENVS["multi_bug_completion"](target, difficulty=1)
    played = rollout(lambda: CAPABILITY_ENVS["multi_bug_completion"](target, difficulty=1),
                     env.reference_policy("oracle"), [Episode(seed=s) for s in range(2)])
    assert all(t.passed and t.info["task_kind"] == "multi" for t in played)
    hinted, info = env.reset(seed=4, options={"hint": True})
    plain, plain_info = env.reset(seed=4)
    assert env.hint(4) in hinted[0].content and env.hint(4) not in plain[0].content and hinted[1:] == plain[1:]
    assert info == plain_info and not any(k.startswith("_") for k in info)


def test_rewards_rest_on_the_capability(target):
    loc = CAPABILITY_ENVS["fault_localization"](target, difficulty=2)
    loc.reset(seed=0)
    task = loc.task
    bug = task.bugs[0]
    decoy_edit = ("str_replace_editor", {"command": "str_replace", "path": task.decoy, "old_str": bug.line.strip(),
                                         "new_str": bug.fixed.strip()})
    assert play(loc, 0, [decoy_edit, ("submit", {})]) == 0.0  # the look-alike: nothing fixed
    ver = TestVerificationEnv(target, difficulty=2)
    ver.reset(seed=1)
    bug = ver.task.bugs[0]
    assert f"`{bug.slipped.strip()}`" in ver.task.problem_statement  # the issue suggests the slip
    fix = ("str_replace_editor", {"command": "str_replace", "path": bug.path, "old_str": bug.line.strip(),
                                  "new_str": bug.fixed.strip()})
    assert play(ver, 1, [fix, ("submit", {})]) == 0.5  # resolved, never tested
    assert play(ver, 1, [fix, ("bash", {"command": "python -m pytest -q"}), ("submit", {})]) == 1.0
    multi = CAPABILITY_ENVS["multi_bug_completion"](target, difficulty=1)
    multi.reset(seed=2)
    first = multi.task.bugs[0]
    assert len(multi.task.bugs) == 2
    assert play(multi, 2, [("str_replace_editor", {"command": "str_replace", "path": first.path, "old_str": first.line.strip(),
                                                   "new_str": first.fixed.strip()}), ("submit", {})]) == 0.5


def test_a_code_template_synthesizes_and_calibrates(target, tmp_path):
    """Like the other templates: an env directory, then the difficulty loop with a seeded base policy
    (the gold calls, each right with p = 0.8: 0.8^3 = 0.51 on a one-bug task, in the band)."""
    from tracerl.contracts import Capability, Rubric

    cap = Capability(name="test_verification", description="d", rubric=Rubric(na="n", present="p", lacking="l"))
    outcome = synthesize_capability(cap, target, tmp_path, seeds=4)
    assert outcome.ok and outcome.source == "template"
    result = calibrate_env_dir(outcome.env_dir, NoisyOraclePolicy(0.8, seed=1), seeds=12, group_size=6, max_rounds=1)
    assert 0.2 <= result.stats.success_rate <= 0.8 and result.rounds[0].difficulty == 1
    assert (outcome.env_dir / "calibration.json").exists()


@pytest.mark.slow
def test_rules_selection_finds_the_planted_gaps(tmp_path):
    played = rollout(lambda: make_env("code", split="train"), make_policy("flawed:0.4,0.4,0.4,0.4"),
                     [Episode(seed=s) for s in range(60)])
    planted = collections.Counter(f for t in played for f in t.info["faults"]["planted"])
    assert set(planted) == {"wrong_location", "no_verify", "one_bug", "malformed_edit"}
    document = run_select(played, SelectConfig(runs=2), seed=0, out_dir=tmp_path).document
    selected = {c.name for c in document.selected()}
    assert selected == {"fault_localization", "test_verification", "multi_bug_completion", "edit_precision"}
    assert not {"tone_and_empathy", "language_fluency"} & selected
