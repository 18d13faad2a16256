"""TRACE's sample-efficiency curve: which steps become points and at what budget, and the composition of
snapshots that plays at each (the final composition's gates, other adapter weights)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "composition"))  # composition_helpers
sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases
sys.path.insert(0, str(Path(__file__).parents[1] / "training"))  # training_helpers

from composition_helpers import make_adapter, save_base, tiny_model, toy_tokenizer
from contract_cases import capabilities_file

from tracerl.models.composed.artifact import GATES_FILE, ROUTER_HEAD_FILE, load_composed, read_spec, with_adapters
from tracerl.contracts import CurvePoint, MetricsRow
from tracerl.core.errors import InputError
from tracerl.evaluation.curve import curve_steps


def rows(*spec: tuple[int, int, bool]) -> list[MetricsRow]:
    """Metrics rows from (step, rollouts_used, evaluated)."""
    return [MetricsRow(step=s, rollouts_used=r, eval_success=0.5 if e else None) for s, r, e in spec]


def test_points_are_the_shared_evaluated_snapshots_the_final_composition_included():
    # two adapters of 6 steps × 32 rollouts, evaluated at 0, 3, 6
    a = rows((0, 0, True), (1, 32, False), (2, 64, False), (3, 96, True), (4, 128, False), (5, 160, False), (6, 192, True))
    b = rows((0, 0, True), (1, 32, False), (2, 96, False), (3, 128, True), (4, 160, False), (5, 192, False), (6, 224, True))
    snaps = {"a": [0, 3, 6], "b": [0, 3, 6]}
    # step 0: 0 + 0 + 5 gate rollouts; step 3: 96 + 128 + 5 = 229; step 6, the final composition: 192 + 224 + 5
    assert curve_steps({"a": a, "b": b}, snaps, 5) == [(0, 5), (3, 229), (6, 421)]
    assert curve_steps({"a": a, "b": b}, snaps, 0) == [(0, 0), (3, 224), (6, 416)]


def test_a_step_is_a_point_only_where_every_adapter_was_evaluated_and_kept_its_snapshot():
    a = rows((0, 0, True), (2, 64, True), (4, 128, True))  # ends at step 4
    b = rows((0, 0, True), (2, 80, True), (4, 150, True), (6, 200, True))  # trained on to step 6
    snaps = {"a": [0, 2, 4], "b": [0, 4, 6]}  # b kept no snapshot of step 2
    # step 0: 0 + 0 + 10; step 2: not kept by b; step 4: 128 + 150 + 10 = 288; step 6: a has no row there
    assert curve_steps({"a": a, "b": b}, snaps, 10) == [(0, 10), (4, 288)]
    assert curve_steps({"a": a, "b": b}, {"a": [0, 2, 4]}, 10) == []  # b kept none
    assert curve_steps({}, {}, 0) == []


def test_a_point_cannot_pass_more_episodes_than_it_played():
    assert CurvePoint(step=3, rollouts=224, passed=5, episodes=32).success == 5 / 32
    with pytest.raises(ValueError, match="33 passed of 32 episodes"):
        CurvePoint(step=3, rollouts=224, passed=33, episodes=32)


REQUESTS = {"alpha": ["cancel my reservation please", "please cancel reservation 12"],
            "beta": ["look up the order status", "what is the order status of 7"]}


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """A tiny base, two capability adapters, and their moe (routed at the opening) and router compositions."""
    from tracerl.cli import main
    from tracerl.core.io import write_jsonl
    from tracerl.core.messages import Message
    from tracerl.core.trajectory import Trajectory

    root = tmp_path_factory.mktemp("curve")
    tokenizer = toy_tokenizer()
    base = tiny_model(seed=0, vocab=len(tokenizer))
    base_dir = save_base(base, tokenizer, root / "base")
    final = [make_adapter(base, root / "final" / n, seed=i + 1, base_name=str(base_dir)) for i, n in enumerate(REQUESTS)]
    zero = [make_adapter(base, root / "step_0" / n, seed=9, scale=0.0, base_name=str(base_dir)) for n in REQUESTS]
    other = [make_adapter(base, root / "step_3" / n, seed=i + 5, scale=2.0, base_name=str(base_dir))
             for i, n in enumerate(REQUESTS)]
    write_jsonl(root / "rollouts.jsonl", [
        Trajectory(task_id=f"{n}-{k}", domain=f"env_{n}", seed=k, passed=True, reward=1.0, info={"capability": n},
                   messages=[Message.system("You are a support agent."), Message.user(f"{texts[k % 2]} ({k})"),
                             Message.assistant("done")])
        for n, texts in REQUESTS.items() for k in range(6)])
    capabilities_file(root / "capabilities.json", list(REQUESTS))
    for mode, extra in (("moe", ["--moe-routing", "opening", "--max-steps", "20"]), ("router", [])):
        assert main(["compose", "--adapters", *map(str, final), "--base", str(base_dir), "--out", str(root / mode),
                     "--capabilities", str(root / "capabilities.json"), "--trajectories", str(root / "rollouts.jsonl"),
                     "--mode", mode, *extra]) == 0
    return root, base_dir, {"final": final, "zero": zero, "other": other}


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("mode, kept", [("moe", GATES_FILE), ("router", ROUTER_HEAD_FILE)])
def test_snapshots_play_under_the_final_compositions_routing(composed, tmp_path, mode, kept):
    root, base_dir, adapters = composed
    original = read_spec(root / mode)
    by_name = {kind: {p.name: p for p in dirs} for kind, dirs in adapters.items()}
    spec = with_adapters(root / mode, by_name["other"], tmp_path / "other")
    assert (tmp_path / "other" / kept).read_bytes() == (root / mode / kept).read_bytes()  # not fitted again
    assert spec.model_copy(update={"adapters": original.adapters, "base": original.base}) == original
    assert [(tmp_path / "other" / a.path).resolve() for a in spec.adapters] == [p.resolve() for p in adapters["other"]]
    assert (tmp_path / "other" / spec.base).resolve() == base_dir.resolve()

    ids = torch.tensor([[5, 17, 42, 8, 99, 3], [7, 7, 120, 64, 2, 11]])
    routing = {}
    if mode == "router":  # one adapter per row, as the router would choose it
        routing = {"routing_weights": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])}
    final = load_composed(root / mode)
    with torch.no_grad():
        want = final(input_ids=ids, **routing).logits
        # the final adapters recomposed: the final composition, exactly
        with_adapters(root / mode, by_name["final"], tmp_path / "same")
        assert torch.equal(load_composed(tmp_path / "same")(input_ids=ids, **routing).logits, want)
        # other weights play: the logits move
        assert not torch.allclose(load_composed(tmp_path / "other")(input_ids=ids, **routing).logits, want)
        # step 0 (LoRA B = 0): the base model, exactly
        with_adapters(root / mode, by_name["zero"], tmp_path / "zero")
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir)
        assert torch.equal(load_composed(tmp_path / "zero")(input_ids=ids, **routing).logits, base(input_ids=ids).logits)


def test_snapshots_must_be_the_compositions_adapters(composed, tmp_path):
    root, _, adapters = composed
    with pytest.raises(InputError, match=r"the composition's adapters are \['alpha', 'beta'\], not \['alpha'\]"):
        with_adapters(root / "moe", {"alpha": adapters["other"][0]}, tmp_path / "out")


def _training_folder(root: Path, name: str, snapshots: dict[int, Path], used: dict[int, int]) -> Path:
    """A training run's folder as the trainer leaves it: metrics.jsonl and snapshots/step_<n>/."""
    import shutil

    from tracerl.contracts import metrics_text

    folder = root / name
    for step, adapter in snapshots.items():
        shutil.copytree(adapter, folder / "snapshots" / f"step_{step}")
    (folder / "metrics.jsonl").write_text(metrics_text([{"step": s, "rollouts_used": r, "eval_success": 0.0}
                                                        for s, r in used.items()]))
    return folder


def test_each_point_plays_grpos_held_out_episodes_greedily(composed, tmp_path):
    """Step 0 (every adapter zero) plays the base's greedy episodes on TrainConfig.heldout_seeds(), token for
    token, as GRPO's evaluation plays them; the points' budgets are the adapters' rollouts + the gate data's."""
    from tracerl.contracts import TraceCurve
    from tracerl.core.io import read_jsonl
    from tracerl.core.trajectory import Trajectory
    from training_helpers import LetterEnv
    from tracerl.envs.runner import Episode, rollout
    from tracerl.evaluation.curve import CurveInputs, run_curve
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.training.config import TrainConfig

    root, base_dir, adapters = composed
    runs = {}
    for i, name in enumerate(REQUESTS):
        runs[name] = _training_folder(tmp_path / "adapters", name,
                                      {0: adapters["zero"][i], 3: adapters["other"][i], 6: adapters["final"][i]},
                                      {0: 0, 3: 96 + 32 * i, 6: 192 + 32 * i})
    config = TrainConfig(eval_episodes=3, seed=4, rollout={"max_new_tokens": 6, "batch_size": 2})
    make_env = LetterEnv
    out = tmp_path / "curve"
    (out / "step_9").mkdir(parents=True)  # a previous run's point: gone
    curve = run_curve(CurveInputs(variant="trace_moe", composed=root / "moe", adapters=runs, gate_rollouts=7,
                                  seeds=config.heldout_seeds()), config.rollout, make_env, out, seed=config.seed)
    # step 0: 0 + 0 + 7; step 3: 96 + 128 + 7 = 231; step 6, the final composition: 192 + 224 + 7 = 423
    assert [(p.step, p.rollouts, p.episodes) for p in curve.points] == [(0, 7, 3), (3, 231, 3), (6, 423, 3)]
    assert TraceCurve.read(out / "curve.json") == curve
    assert (out / curve.composed).resolve() == (root / "moe").resolve()
    assert sorted(p.name for p in out.iterdir()) == ["curve.json", "step_0", "step_0.jsonl", "step_3", "step_3.jsonl",
                                                    "step_6", "step_6.jsonl"]
    model, tokenizer = load_model(str(base_dir))
    base = rollout(make_env, LocalPolicy(model, tokenizer, temperature=0.0, seed=4, max_new_tokens=6, max_batch_size=2),
                   [Episode(seed=s) for s in config.heldout_seeds()], batch_size=2)
    step0 = read_jsonl(out / "step_0.jsonl", Trajectory)
    assert [t.seed for t in step0] == [1_000_000, 1_000_001, 1_000_002]
    assert [t.tokens.ids for t in step0] == [t.tokens.ids for t in base]
    assert curve.points[0].passed == sum(t.passed for t in base)
    step3 = read_jsonl(out / "step_3.jsonl", Trajectory)
    assert [t.tokens.ids for t in step3] != [t.tokens.ids for t in base]  # other weights play there


def test_no_points_when_evaluation_is_off_or_no_snapshot_was_kept(tmp_path):
    from tracerl.contracts import TraceCurve
    from tracerl.core.sampling import RolloutSettings
    from tracerl.evaluation.curve import CurveInputs, run_curve
    from tracerl.training.config import TrainConfig

    inputs = CurveInputs(variant="trace_moe", composed=tmp_path / "composed", adapters={"a": tmp_path / "a"},
                         gate_rollouts=0, seeds=[])
    curve = run_curve(inputs, RolloutSettings(), lambda: None, tmp_path / "curve", seed=0)
    assert curve.points == [] and curve.note.startswith("train.eval_episodes is 0")
    assert TraceCurve.read(tmp_path / "curve" / "curve.json") == curve
    inputs.seeds = TrainConfig().heldout_seeds()
    curve = run_curve(inputs, RolloutSettings(), lambda: None, tmp_path / "curve", seed=0)
    assert curve.points == [] and curve.note.startswith("no step at which every adapter")
