"""The live ToolSandBox target: ToolSandBox's own scenarios, tools, user simulator and evaluation, run for real.

They need a Python with ToolSandBox (scripts/test.sh builds `.venv-toolsandbox` from a local copy of the
public source, github.com/apple/ToolSandbox, and sets TRACERL_REQUIRE_TOOLSANDBOX=1, which turns a missing
ToolSandBox into a failure instead of a skip). The user simulator is the tiny agent served on loopback by
`tracerl serve`'s server. Its user turns are poor, and the tools it knows are the airline's, which
ToolSandBox's user role rejects (the episode ends as `user_error`, scored 0 as ToolSandBox's runner
scores it): it is asked with `tool_choice: none`, so it only speaks, cannot end the conversation, and
episodes end at the message limit (`max_messages`, set low here to keep the tests short).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracerl.core.errors import InputError
from tracerl.core.messages import Message, ToolCall

ROOT = Path(__file__).resolve().parents[2]
RAPID_API = {"search_lat_lon", "search_location_around_lat_lon", "search_weather_around_lat_lon", "search_stock",
             "convert_currency"}
STOPS = {"user_stop", "max_messages", "agent_error", "user_error"}

pytestmark = pytest.mark.timeout(1800)


def _missing(reason: str) -> None:
    if os.environ.get("TRACERL_REQUIRE_TOOLSANDBOX"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sandbox_python() -> str:
    python = os.environ.get("TRACERL_TOOLSANDBOX_PYTHON") or str(ROOT / ".venv-toolsandbox" / "bin" / "python")
    if not Path(python).exists():
        _missing(f"no Python with ToolSandBox at {python} (bash scripts/test.sh makes one)")
    return python


@pytest.fixture(scope="module")
def served():
    """The tiny agent behind the OpenAI API on loopback, as `tracerl serve` runs it: the user simulator."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=4) as server:
        yield server.base_url


def sandbox_env(python: str, base_url: str, split: str | None = "base", **settings):
    from tracerl.envs.registry import make_env

    settings.setdefault("user", {"model": "tiny-agent", "base_url": base_url, "max_tokens": 24, "tool_choice": "none"})
    return make_env("toolsandbox", split=split, python=python, **settings)


@pytest.mark.slow
def test_offline_scenarios_splits_and_tools(sandbox_python, served):
    env = sandbox_env(sandbox_python, served)
    assert len(env.task_ids) == 91 and len(env.left_out) == 38 and not set(env.task_ids) & set(env.left_out)
    for name, why in env.left_out.items():  # every one left out calls RapidAPI, and says which tool
        assert why.startswith("calls RapidAPI (") and any(tool in why for tool in RAPID_API), (name, why)
    assert "find_temperature_f_with_location" in env.left_out and "convert_currency" in env.left_out
    train = sandbox_env(sandbox_python, served, split="train")
    test = sandbox_env(sandbox_python, served, split="test")
    assert (len(train.task_ids), len(test.task_ids)) == (61, 30) and not set(train.task_ids) & set(test.task_ids)
    assert set(train.task_ids) | set(test.task_ids) == set(env.task_ids)
    assert test.task_ids == sorted(env.task_ids)[2::3]  # every third in name order
    assert env.system_prompt == ("Don't make assumptions about what values to plug into functions. "
                                 "Ask for clarification if a user request is ambiguous.")
    kinds = {t.name: t.kind for t in env.tools}
    assert len(kinds) == 24 and not RAPID_API & set(kinds)
    assert (kinds["search_contacts"], kinds["remove_contact"], kinds["send_message_with_phone_number"],
            kinds["get_current_timestamp"]) == ("read", "write", "write", "generic")
    messages, info = env.reset(seed=0, options={"task_id": "cellular_off"})
    assert [m.role for m in messages] == ["system", "user"] and messages[1].content == "Turn off cellular"
    assert [t.name for t in env.tools] == ["set_cellular_service_status"]  # the scenario's own tools
    assert info["source"] == "toolsandbox-live" and info["toolsandbox_version"] == "0.0.1"
    assert info["milestone_steps"] == [{"say": "Cellular service is turned off"}]  # its other milestone: the setting


@pytest.mark.slow
def test_agent_errors_are_scored_as_toolsandbox_scores_them(sandbox_python, served):
    env = sandbox_env(sandbox_python, served)
    env.reset(seed=0, options={"task_id": "cellular_off"})
    new, reward, terminated, truncated, info = env.step(
        Message.assistant(None, [ToolCall.make("get_reservation_details", {"reservation_id": "A"}, "c1")]))
    assert (new, reward, terminated, truncated) == ([], 0.0, True, False) and info["termination"] == "agent_error"
    assert "is not a known allowed tool" in info["error"]
    result = info["trajectory_info"]["toolsandbox_result"]
    assert result["exception_type"] == "KeyError" and result["similarity"] == 0 and result["name"] == "cellular_off"
    env.reset(seed=0, options={"task_id": "cellular_off"})
    bad = Message.assistant(None, [ToolCall(id="c2", function={"name": "set_cellular_service_status", "arguments": "{on"})])
    _, reward, terminated, _, info = env.step(bad)
    assert (reward, terminated, info["termination"]) == (0.0, True, "agent_error") and "JSONDecodeError" in info["error"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(Message.assistant("hello"))


def play_out(env, scenario: str, first: list[Message]) -> tuple[float, dict]:
    """Play `first`, then close politely until ToolSandBox ends the episode; (reward, the last step's info)."""
    env.reset(seed=0, options={"task_id": scenario})
    k = 0
    while True:
        message = first[k] if k < len(first) else Message.assistant("Is there anything else I can help you with?")
        _, reward, terminated, truncated, info = env.step(message)
        k += 1
        if terminated or truncated:
            return reward, info


@pytest.mark.slow
def test_milestone_replays_and_a_minefield_are_graded_by_toolsandbox(sandbox_python, served):
    """An agent that does what the milestones name scores ToolSandBox's perfect 1.0 (benchmarks/README.md: 24 of
    the 91 offline scenarios, where the milestones name every call with the arguments it needs); without
    its tool calls it scores less; a call a minefield forbids zeroes the episode."""
    from tracerl.envs.runner import Episode, rollout
    from tracerl.envs.toolsandbox import MilestoneReplay

    forbidden = "send_message_with_contact_content_cellular_off_insufficient_information"  # no number: do not send
    scenarios = ["get_cellular", "search_phone_number_with_name", forbidden]

    def make():
        return sandbox_env(sandbox_python, served, scenarios=scenarios, max_messages=8)

    start = time.perf_counter()
    full = rollout(make, MilestoneReplay(), [Episode(seed=s) for s in range(3)], batch_size=3)
    words = rollout(make, MilestoneReplay(drop=("call",)), [Episode(seed=s) for s in range(2)], batch_size=2)
    print(f"\nmilestone replays: {[(t.task_id, t.reward, t.termination) for t in full]}; without calls: "
          f"{[(t.task_id, t.reward) for t in words]} ({time.perf_counter() - start:.0f} s)")
    for t in full + words:
        assert t.domain == "toolsandbox" and t.termination == "max_messages" and t.task_id in scenarios
        assert t.reward == t.info["toolsandbox_result"]["similarity"] and t.passed == (t.reward == 1.0)
    for t in full:
        assert t.reward == 1.0 and t.passed, (t.task_id, t.info["toolsandbox_result"])
        assert t.info["toolsandbox_conversation"][0]["role"] == "system"  # ToolSandBox's own conversation.json
        assert t.reward_breakdown == {"milestone_similarity": 1.0, "minefield_similarity": 0.0}
    assert [t.reward < 1.0 for t in words] == [True, True]
    send = ToolCall.make("send_message_with_phone_number", {"phone_number": "+12453344098", "content": "Yes"}, "c1")
    reward, info = play_out(make(), forbidden, [Message.assistant(None, [send])])
    assert reward == 0.0 and info["reward_breakdown"]["minefield_similarity"] > 0, info["reward_breakdown"]


@pytest.mark.slow
def test_tiny_agent_episodes_and_the_results_folder(sandbox_python, served, tmp_path):
    """The tiny agent plays three test scenarios twice (it names airline tools: ToolSandBox's runner scores
    that 0) and the milestone replay one scenario ToolSandBox grades perfect; the episodes are written as
    ToolSandBox run folders (one per trial, aggregated by ToolSandBox's own code) and read back as rollouts."""
    from tracerl.envs.loading import load_rollouts
    from tracerl.models.factory import make_policy
    from tracerl.envs.runner import Episode, rollout
    from tracerl.envs.toolsandbox import MilestoneReplay, write_toolsandbox_results
    from tracerl.evaluation.evaluate import play

    def make():
        return sandbox_env(sandbox_python, served, split="test", max_messages=8)

    env = make()
    policy = make_policy("model", max_new_tokens=48, temperature=1.0, seed=3)
    start = time.perf_counter()
    tiny = play(make, policy, env.task_seeds(3), trials=2, batch_size=6)
    print(f"\ntiny agent on ToolSandBox: {[(t.task_id, t.reward, t.termination) for t in tiny]} "
          f"({time.perf_counter() - start:.0f} s)")
    assert [t.task_id for t in tiny] == [n for n in env.task_ids[:3] for _ in range(2)]
    for t in tiny:
        assert t.termination in STOPS and 0.0 <= t.reward <= 1.0
        assert t.messages[0].role == "system" and t.tokens is not None and sum(t.tokens.mask) > 0
        assert t.info["user_simulator"]["base_url"] == served and t.info["categories"]
    [replayed] = rollout(lambda: sandbox_env(sandbox_python, served, scenarios=["get_cellular"], max_messages=8),
                         MilestoneReplay(), [Episode(seed=0)])
    assert replayed.reward == 1.0
    trajectories = tiny + [replayed]
    runs = write_toolsandbox_results(tmp_path / "run", env, trajectories)
    assert runs == [tmp_path / "run" / "trial_0", tmp_path / "run" / "trial_1"]
    trials = [tiny[0::2] + [replayed], tiny[1::2]]  # a scenario's k-th episode is in trial k
    for run, mine in zip(runs, trials, strict=True):
        summary = json.loads((run / "result_summary.json").read_text())
        assert [r["name"] for r in summary["per_scenario_results"]] == [t.task_id for t in mine]
        # ToolSandBox's aggregation: the mean similarity over every scenario, and over each category's
        for category, figures in summary["category_aggregated_results"].items():
            members = [t.reward for t in mine if category == "ALL_CATEGORIES" or category in t.info["categories"]]
            assert figures["similarity"] == pytest.approx(sum(members) / len(members)), category
        back = load_rollouts(run)
        assert [(t.task_id, t.reward, t.passed) for t in back] == [(t.task_id, t.reward, t.passed) for t in mine]
        assert all(b.messages[1] == t.messages[1] for b, t in zip(back, mine))  # the user's opening, as played
    overall = json.loads((runs[0] / "result_summary.json").read_text())["category_aggregated_results"]["ALL_CATEGORIES"]
    assert overall["similarity"] == pytest.approx((sum(t.reward for t in tiny[0::2]) + 1.0) / 4)
    replayed_back = load_rollouts(runs[0])[-1]  # read from ToolSandBox's own conversation.json
    assert [m.role for m in replayed_back.messages[:4]] == ["system", "user", "assistant", "tool"]
    assert replayed_back.messages[2].tool_calls[0].function.name == "get_cellular_service_status"


def _cli(sandbox_python: str, scenario: str, typed: list[str], out: Path) -> Path:
    """ToolSandBox's own CLI with its CLI agent and CLI user (a person at a terminal: here, lines on stdin)."""
    cli = Path(sandbox_python).parent / "tool_sandbox"
    done = subprocess.run([str(cli), "--agent", "Cli", "--user", "Cli", "-s", scenario, "-p", "1", "-o", str(out)],
                          input="\n".join(typed) + "\n", capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("*/result_summary.json"))


@pytest.mark.slow
def test_toolsandbox_cli_runs_import_for_select(sandbox_python, tmp_path):
    """Runs ToolSandBox's CLI wrote import as rollouts and `tracerl select` reads them: one it graded (the
    agent answered in words), one that raised (its CLI agent's call is code ToolSandBox cannot convert back,
    so it wrote no conversation.json: the conversation comes from its execution context)."""
    from tracerl.cli import main
    from tracerl.envs.loading import load_rollouts

    talked = _cli(sandbox_python, "get_cellular", ["Cellular service is on", "end"], tmp_path / "talked")
    called = _cli(sandbox_python, "cellular_off",
                  ["tool", "set_cellular_service_status(on=False)", "Cellular service is turned off", "end"],
                  tmp_path / "called")
    [graded] = load_rollouts(talked.parent)
    assert graded.task_id == "get_cellular" and graded.termination == "user_stop" and graded.domain == "toolsandbox"
    assert graded.reward == json.loads(talked.read_text())["per_scenario_results"][0]["similarity"] < 1.0
    assert [m.role for m in graded.messages] == ["system", "user", "assistant"]
    [raised] = load_rollouts(called)
    assert raised.termination == "error" and raised.reward == 0.0 and raised.info["error"] == "AssertionError"
    assert [m.role for m in raised.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = raised.messages[2].tool_calls[0]
    assert call.function.name == "set_cellular_service_status" and "on=False" in call.function.arguments
    assert main(["select", "--rollouts", str(called.parent), "--runs", "2", "--out", str(tmp_path / "sel")]) == 0
    assert json.loads((tmp_path / "sel" / "capabilities.json").read_text())["totals"]["trajectories"] == 1


LOOP = """
seed: 0
model: {base: tiny-agent}
rollout: {max_new_tokens: 32, batch_size: 8}
target: {env: toolsandbox, toolsandbox: toolsandbox.yaml}
collect: {tasks: 4}
select: {runs: 2, bootstrap: 50, rho: 0.0, delta: -1.0, max_selected: 1}
synthesize: {calibration_seeds: 2, group_size: 2, max_rounds: 1, bands: {min_reward_std: 2.0}}
train: {num_generations: 2, groups_per_step: 1, max_steps: 1, eval_steps: 1, eval_episodes: 1, max_resample_tries: 1,
        learning_rate: 0.002, lora: {r: 4, lora_alpha: 8}}
train_rejected: true
compose: {modes: [router], episodes_per_capability: 2}
baselines: {single_adapters: false, prompt_capabilities: false, gepa: false}
eval: {tasks: 3, trials: 1, bootstrap: 100}
"""


@pytest.mark.slow
def test_tracerl_run_on_toolsandbox(sandbox_python, served, tmp_path):
    """The whole loop on ToolSandBox, live: collect on its train split, select, synthesize over its own tool
    schemas, train, compose, GRPO on its train split, evaluate on its test split, graded by ToolSandBox."""
    from tracerl.cli import main
    from tracerl.core.io import read_json, read_jsonl
    from tracerl.core.trajectory import Trajectory
    from tracerl.envs.loading import load_rollouts

    (tmp_path / "toolsandbox.yaml").write_text(
        f"user: {{model: tiny-agent, base_url: '{served}', max_tokens: 16, tool_choice: none}}\n"
        f"python: {sandbox_python}\nmax_messages: 8\n")
    (tmp_path / "run.yaml").write_text(LOOP)
    ws = tmp_path / "ws"
    start = time.perf_counter()
    assert main(["run", str(tmp_path / "run.yaml"), "-w", str(ws), "--json"]) == 0
    print(f"\ntracerl run on ToolSandBox: {time.perf_counter() - start:.0f} s")
    done = {p.stem for p in (ws / ".stages").glob("*.json")}
    assert {"collect", "select", "synthesize", "compose", "grpo_target", "eval:base", "eval:trace_router",
            "eval:grpo_target", "report"} <= done and any(s.startswith("train:") for s in done)
    env = sandbox_env(sandbox_python, served, split="train")
    assert [t.task_id for t in read_jsonl(ws / "rollouts" / "base.jsonl", Trajectory)] == env.task_ids[:4]
    target = read_json(next((ws / "envs").glob("*/target.json")))
    assert {"search_contacts", "remove_contact"} <= {t["function"]["name"] for t in target["tools"]}
    test_ids = sandbox_env(sandbox_python, served, split="test").task_ids[:3]
    for variant in ("base", "trace_router", "grpo_target"):
        ours = read_json(ws / "eval" / f"{variant}.json")
        assert sorted(ours["per_task"]) == sorted(test_ids)
        assert ours["grading"]["grader"] == "ToolSandBox 0.0.1"
        theirs = load_rollouts(ws / "eval" / "toolsandbox" / variant)
        assert sorted(t.task_id for t in theirs) == sorted(test_ids)
        assert ours["mean_reward"] == pytest.approx(sum(t.reward for t in theirs) / 3)
    assert "Graded live by ToolSandBox 0.0.1" in (ws / "report" / "index.html").read_text()


# --- bad input: one line, before any episode ---------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_toolsandbox_not_installed():
    with pytest.raises(InputError, match="ToolSandBox is not installed for") as e:
        sandbox_env(sys.executable, "http://127.0.0.1:1/v1")  # the test venv: tracerl's, no ToolSandBox
    assert "\n" not in str(e.value) and "github.com/apple/ToolSandbox" in str(e.value)


@pytest.mark.slow
def test_bad_settings_are_one_line(sandbox_python, served):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(InputError, match=f"toolsandbox.user: the endpoint {url} does not answer"):
        sandbox_env(sandbox_python, url)
    with pytest.raises(InputError, match="no split 'dev'"):
        sandbox_env(sandbox_python, served, split="dev")
    with pytest.raises(InputError, match="names no scenario 'nowhere'"):
        sandbox_env(sandbox_python, served, scenarios=["nowhere"])
    with pytest.raises(InputError, match="'convert_currency', which is left out: calls RapidAPI"):
        sandbox_env(sandbox_python, served, splits={"train": ["convert_currency"]})
    with pytest.raises(InputError, match="toolsandbox settings: user.model: Field required"):
        sandbox_env(sandbox_python, served, user={"base_url": served})


def test_cli_needs_the_settings(capsys):
    from tracerl.cli import main

    assert main(["collect", "--env", "toolsandbox", "--tasks", "1", "--out", os.devnull]) == 2
    err = capsys.readouterr().err.strip()
    assert "--env toolsandbox needs --toolsandbox SETTINGS.yaml" in err and len(err.splitlines()) == 1
