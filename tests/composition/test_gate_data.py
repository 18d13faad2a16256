"""The gate data the pipeline's compose stage rolls out (`composition.stage.roll_gate_data`): each
adapter's successful rollouts on its own environment, or its best-rewarded ones when none succeeds;
or, when no composition needs whole episodes, the environments' openings with nothing played."""

from pathlib import Path

from tracerl.composition.stage import GATE_SEED_OFFSET, ComposeConfig, needs_gate_rollouts, roll_gate_data
from tracerl.contracts import EnvSpec, GateData, GateKept
from tracerl.core.io import read_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.envs.synthetic.envdir import write_env_dir
from tracerl.synthesis.scripted import NoisyOraclePolicy
from tracerl.synthesis.target import load_target

RETAIL = Path(__file__).parents[1] / "data" / "tau2" / "retail" / "tools.json"
CAP = "multi_step_completion"


def test_successes_are_kept_else_the_best_rewarded(tmp_path):
    env = write_env_dir(tmp_path / "envs" / CAP, EnvSpec(capability=CAP, template=CAP, target="retail", difficulty=0),
                        load_target(str(RETAIL)))
    # every gold call right: all 3 pass and are kept, labelled with the capability, on the gate-data seeds
    data, paths = roll_gate_data({CAP: env}, lambda: NoisyOraclePolicy(1.0), 3, tmp_path / "good")
    assert data == GateData(rollouts=3, kept={CAP: GateKept(trajectories=3, of=3, source="successful")})
    assert GateData.read(tmp_path / "good" / "summary.json") == data and paths == [tmp_path / "good" / f"{CAP}.jsonl"]
    kept = read_jsonl(paths[0], Trajectory)
    assert [t.seed for t in kept] == [GATE_SEED_OFFSET + i for i in range(3)]
    assert all(t.passed and t.info["capability"] == CAP for t in kept)
    # every call wrong: none passes; each earns 0.125 (half of one of two requests tried, halved for the unasked
    # write: tests/synthesis/test_calibration.py), so all three share the best reward and are kept
    data, paths = roll_gate_data({CAP: env}, lambda: NoisyOraclePolicy(0.0), 3, tmp_path / "bad")
    assert data.kept[CAP] == GateKept(trajectories=3, of=3, source="best reward 0.12 (no success)")
    assert [t.reward for t in read_jsonl(paths[0], Trajectory)] == [0.125] * 3


def test_openings_only_plays_nothing(tmp_path):
    env = write_env_dir(tmp_path / "envs" / CAP, EnvSpec(capability=CAP, template=CAP, target="retail", difficulty=0),
                        load_target(str(RETAIL)))

    def no_policy():
        raise AssertionError("no episode is played")

    data, paths = roll_gate_data({CAP: env}, no_policy, 3, tmp_path / "openings", openings_only=True)
    assert data == GateData(rollouts=0, kept={CAP: GateKept(trajectories=0, of=0, source="openings", openings=3)})
    openings = read_jsonl(paths[0], Trajectory)
    played = read_jsonl(roll_gate_data({CAP: env}, lambda: NoisyOraclePolicy(1.0), 3, tmp_path / "played")[1][0], Trajectory)
    # each opening is the played episode's start: the system prompt and the first user turn, labelled
    for opening, episode in zip(openings, played, strict=True):
        assert opening.seed == episode.seed and opening.info["capability"] == CAP and opening.termination == "opening"
        assert opening.messages == episode.messages[: len(opening.messages)] and opening.messages[-1].role == "user"
        assert opening.tools == episode.tools and opening.reward == 0.0


def test_only_moe_routed_per_token_needs_rollouts():
    assert needs_gate_rollouts(ComposeConfig(modes=["moe", "router"], moe_routing="token"))
    assert not needs_gate_rollouts(ComposeConfig(modes=["moe", "router"]))  # routed at the opening by default
    assert not needs_gate_rollouts(ComposeConfig(modes=["router", "merge"]))
