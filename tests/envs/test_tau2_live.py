"""The live τ²-bench target and τ²-bench judging `tracerl serve`: τ²-bench's own code, run for real.

They need a Python ≥ 3.12 with τ²-bench (scripts/test.sh builds `.venv-tau2` with it — public
source github.com/sierra-research/tau2-bench — and sets TRACERL_REQUIRE_TAU2=1, which turns a
missing τ²-bench into a failure instead of a skip) and τ²-bench's data: its mock and retail domains
and the user simulator's guidelines, copied into tests/data/tau2 (PROVENANCE.md there). The user
simulator (and, for `tau2 run`, the agent) is the tiny agent served on loopback by `tracerl serve`'s
server.
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
DATA = ROOT / "tests" / "data" / "tau2"  # τ²-bench's mock and retail domains and user-simulator guidelines
STOPS = {"user_stop", "agent_stop", "max_steps", "too_many_errors", "agent_error", "user_error", "infrastructure_error"}

pytestmark = pytest.mark.timeout(1800)


def _missing(reason: str) -> None:
    if os.environ.get("TRACERL_REQUIRE_TAU2"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def tau2_python() -> str:
    python = os.environ.get("TRACERL_TAU2_PYTHON") or str(ROOT / ".venv-tau2" / "bin" / "python")
    if not Path(python).exists():
        _missing(f"no Python with τ²-bench at {python} (bash scripts/test.sh makes one)")
    return python


@pytest.fixture(scope="module")
def tau2_data(tmp_path_factory) -> str:
    """A τ²-bench data folder (outside the repository, since τ²-bench may write beside its data): links to
    the mock and retail domains and the user simulator's guidelines in tests/data/tau2."""
    domains = DATA / "domains"
    root = tmp_path_factory.mktemp("tau2-data")
    (root / "tau2" / "domains").mkdir(parents=True)
    for name in ("mock", "retail"):
        (root / "tau2" / "domains" / name).symlink_to(domains / name, target_is_directory=True)
    (root / "tau2" / "user_simulator").symlink_to(DATA / "user_simulator", target_is_directory=True)
    return str(root)


@pytest.fixture(scope="module")
def served():
    """The tiny agent behind the OpenAI API on loopback, as `tracerl serve` runs it."""
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=4) as server:
        yield server.base_url


def tau2_env(domain: str, tau2_python: str, tau2_data: str, base_url: str, **settings):
    from tracerl.envs.registry import make_env

    user = {"model": "tiny-agent", "base_url": base_url, "max_tokens": 24}
    return make_env(f"tau2:{domain}", python=tau2_python, data_dir=tau2_data, user=user, **settings)


def replay(env, task_id: str, actions: list[dict]) -> tuple[float, str]:
    """Play a task's actions as the agent's tool calls, then end with τ²-bench's `done` tool. An
    episode the user simulator breaks (the tiny agent as the user writes a reply τ²-bench cannot
    parse) ends as (0.0, 'infrastructure_error')."""
    env.reset(seed=0, options={"task_id": task_id})
    for i, action in enumerate(actions):
        _, _, terminated, truncated, info = env.step(Message.assistant(None, [ToolCall.make(action["name"], action["arguments"], f"gold_{i}")]))
        if info.get("termination") == "infrastructure_error":
            return 0.0, "infrastructure_error"
        assert not (terminated or truncated), f"task {task_id}: the episode ended at action {i}"
    _, reward, terminated, _, info = env.step(Message.assistant(None, [ToolCall.make("done", {}, "end")]))
    assert terminated
    return reward, info["termination"]


@pytest.mark.slow
def test_live_mock_episodes_with_the_tiny_agent(tau2_python, tau2_data, served):
    from tracerl.models.factory import make_policy
    from tracerl.envs.runner import Episode, rollout

    def make():
        return tau2_env("mock", tau2_python, tau2_data, served, max_steps=12)

    env = make()
    policy = make_policy("model", max_new_tokens=48)
    start = time.perf_counter()
    trajectories = rollout(make, policy, [Episode(seed=s) for s in range(3)], batch_size=3)
    elapsed = time.perf_counter() - start
    print(f"\nlive mock episodes: {len(trajectories)} in {elapsed:.1f} s ({len(trajectories) / elapsed:.3f}/s)")
    assert [t.task_id for t in trajectories] == env.task_ids[:3]
    assert any(t.termination != "infrastructure_error" for t in trajectories)  # the tiny user simulator may break one
    for t in trajectories:
        assert t.domain == "mock" and t.termination in STOPS
        if t.termination == "infrastructure_error":
            continue
        assert t.messages[0].role == "system" and "<policy>" in t.messages[0].content
        assert t.messages[1].content == "Hi! How can I help you today?"  # τ²-bench's opening greeting
        assert any(m.role == "user" for m in t.messages[2:])  # the user simulator answered
        assert t.info["user_simulator"]["base_url"] == served and t.info["tau2_version"] == "1.0.1"
        assert t.info["reward_basis"] and set(t.reward_breakdown) <= set(t.info["reward_basis"])
        assert 0.0 <= t.reward <= 1.0 and (t.termination in {"user_stop", "agent_stop"} or t.reward == 0.0)
        assert t.tokens is not None and sum(t.tokens.mask) > 0 and len(t.tokens.ids) > t.tokens.prompt_len
        assert "done" in {tool.name for tool in t.tools}


TAU2_METRICS = """
import json, sys
from tau2.data_model.simulation import Results
from tau2.metrics.agent_metrics import compute_metrics
results = Results.load(sys.argv[1])
metrics = compute_metrics(results)
print(json.dumps({"pass_hat_ks": metrics.pass_hat_ks, "avg_reward": metrics.avg_reward,
                  "tasks": [t.id for t in results.tasks], "trials": results.info.num_trials,
                  "agent": results.info.agent_info.llm, "user": results.info.user_info.llm}))
"""


def tau2_metrics(tau2_python: str, tau2_data: str, path: Path) -> dict:
    """τ²-bench's own reading of a results file: its `Results.load` and `compute_metrics`."""
    done = subprocess.run([tau2_python, "-c", TAU2_METRICS, str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TAU2_DATA_DIR": tau2_data, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_results_file_is_read_by_tau2_and_pass_k_agrees(tau2_python, tau2_data, served, tmp_path):
    from tracerl.models.factory import make_policy
    from tracerl.envs.tau2_live import write_tau2_results
    from tracerl.evaluation.evaluate import play
    from tracerl.evaluation.stats import pass_hat_k, successes_by_task

    def make():
        return tau2_env("mock", tau2_python, tau2_data, served, max_steps=10, reward_basis=["DB"])

    env = make()
    policy = make_policy("model", max_new_tokens=32, temperature=1.0, seed=3)
    trajectories = play(make, policy, env.task_seeds(3), trials=2, batch_size=6)
    path = tmp_path / "results.json"
    write_tau2_results(path, env, trajectories, agent="tiny-agent")
    theirs = tau2_metrics(tau2_python, tau2_data, path)
    assert theirs["tasks"] == env.task_ids[:3] and theirs["trials"] == 2
    assert theirs["agent"] == "tiny-agent" and theirs["user"] == "openai/tiny-agent"
    counts = list(successes_by_task(trajectories).values())
    ours = {k: pass_hat_k(counts, k) for k in (1, 2)}
    assert {int(k): v for k, v in theirs["pass_hat_ks"].items()} == pytest.approx(ours)
    assert theirs["avg_reward"] == pytest.approx(sum(t.reward for t in trajectories) / len(trajectories))
    assert "api_key" not in path.read_text()


@pytest.mark.slow
def test_collect_cli_writes_a_tau2_results_file(tau2_python, tau2_data, served, tmp_path, monkeypatch):
    from tracerl.cli import main
    from tracerl.core.io import read_jsonl
    from tracerl.core.trajectory import Trajectory

    monkeypatch.setenv("TAU2_DATA_DIR", tau2_data)
    settings = tmp_path / "tau2.yaml"
    settings.write_text(f"user: {{model: tiny-agent, base_url: '{served}', max_tokens: 24}}\n"
                        f"python: {tau2_python}\nreward_basis: [DB]\nmax_steps: 8\n")
    out, results = tmp_path / "rollouts.jsonl", tmp_path / "results.json"
    assert main(["collect", "--env", "tau2:mock", "--tau2", str(settings), "--split", "base", "--tasks", "2",
                 "--offset", "1", "--policy", "model", "--out", str(out), "--tau2-results", str(results)]) == 0
    trajectories = read_jsonl(out, Trajectory)
    assert [t.info["tau2_simulation"]["task_id"] for t in trajectories] == [t.task_id for t in trajectories]
    assert tau2_metrics(tau2_python, tau2_data, results)["tasks"] == [t.task_id for t in trajectories]


@pytest.mark.slow
def test_tau2_run_grades_what_tracerl_serve_serves(tau2_python, tau2_data, served, tmp_path):
    """τ²-bench's own CLI, agent and user on `tracerl serve`: tool calls in the OpenAI format it sends."""
    trajectories = tau2_run(tau2_python, tau2_data, served, "tiny-agent", served, "tracerl-served", tmp_path, tasks=2)
    assert len(trajectories) == 2
    for t in trajectories:
        assert t.termination != "infrastructure_error", t.info
        assert t.termination in STOPS
        spoken = [m for m in t.messages if m.role == "assistant"][1:]  # after τ²-bench's greeting: the served model
        assert spoken and all(m.content or m.tool_calls for m in spoken)


@pytest.mark.slow
def test_retail_gold_replays_pass_under_db_basis_and_damaged_ones_fail(tau2_python, tau2_data, served):
    env = tau2_env("retail", tau2_python, tau2_data, served, split="base", reward_basis=["DB"], max_steps=100)
    assert len(env.task_ids) == 114  # τ²-bench 1.0.1's retail split_tasks.json: base = 74 train + 40 test
    kinds = {t.name: t.kind for t in env.tools}
    assert kinds["cancel_pending_order"] == "write" and kinds["get_order_details"] == "read" and "done" in kinds
    failures, damaged, simulator_errors = [], [], []
    start = time.perf_counter()
    for task_id in env.task_ids:
        messages, info = env.reset(seed=0, options={"task_id": task_id})
        assert info["reward_basis"] == ["DB"] and info["user_simulator"]["model"] == "tiny-agent"
        gold = info["gold_actions"]
        reward, termination = replay(env, task_id, gold)
        if termination == "infrastructure_error":  # the simulated user failed, not the target
            simulator_errors.append(task_id)
            continue
        if reward != 1.0 or termination != "agent_stop":
            failures.append((task_id, reward, termination))
        writes = [i for i, a in enumerate(gold) if kinds.get(a["name"]) == "write"]
        if writes and len(damaged) < 4:
            damaged.append((task_id, gold, writes[-1]))
    elapsed = time.perf_counter() - start
    played = len(env.task_ids) - len(simulator_errors)
    print(f"\nretail gold replays: {played - len(failures)}/{played} at reward 1.0 (DB), {elapsed:.0f} s; "
          f"user simulator failed on {len(simulator_errors)}")
    assert failures == [] and simulator_errors == [], (failures, simulator_errors)  # measured: 114 of 114 (2026-12-02)
    for task_id, gold, last_write in damaged:
        dropped = gold[:last_write] + gold[last_write + 1:]
        assert replay(env, task_id, dropped) == (0.0, "agent_stop"), task_id
        call = gold[last_write]
        key = next(k for k, v in call["arguments"].items() if isinstance(v, str))
        corrupted = [*gold[:last_write], {**call, "arguments": {**call["arguments"], key: call["arguments"][key] + "x"}}]
        assert replay(env, task_id, corrupted)[0] == 0.0, task_id


LOOP = """
seed: 0
model: {base: tiny-agent}
rollout: {max_new_tokens: 32, batch_size: 8}
target: {env: "tau2:retail", tau2: tau2.yaml}
collect: {tasks: 6}
select: {runs: 2, bootstrap: 50, rho: 0.0, delta: -1.0, max_selected: 1}
synthesize: {calibration_seeds: 2, group_size: 4, max_rounds: 1, bands: {min_reward_std: 2.0}}
train: {num_generations: 2, groups_per_step: 2, max_steps: 2, eval_steps: 2, eval_episodes: 2, max_resample_tries: 1,
        learning_rate: 0.002, lora: {r: 4, lora_alpha: 8}}
train_rejected: true
compose: {modes: [moe, router], episodes_per_capability: 4, gate: {max_steps: 2}}
baselines: {single_adapters: false, prompt_capabilities: false}
eval: {tasks: 3, trials: 2, bootstrap: 100}
"""


@pytest.fixture(scope="module")
def retail_run(tau2_python, tau2_data, served, tmp_path_factory):
    """`tracerl run` on τ²-bench retail, live (the workspace, its stage log and seconds)."""
    from tracerl.cli import main

    root = tmp_path_factory.mktemp("retail-run")
    (root / "tau2.yaml").write_text(
        f"user: {{model: tiny-agent, base_url: '{served}', max_tokens: 24}}\npython: {tau2_python}\n"
        f"data_dir: {tau2_data}\nreward_basis: [DB]\nmax_steps: 8\n")
    (root / "run.yaml").write_text(LOOP)
    ws = root / "ws"
    start = time.perf_counter()
    assert main(["run", str(root / "run.yaml"), "-w", str(ws), "--json"]) == 0
    return ws, time.perf_counter() - start


@pytest.mark.slow
def test_tracerl_run_on_live_retail(retail_run, tau2_python, tau2_data):
    """The whole loop on τ²-bench retail, live: collect on its train split, select, synthesize over its
    own tool schemas, train, compose, GRPO on its train split, evaluate on its test split; τ²-bench's
    own metrics read the evaluation's results files and agree with ours."""
    from tracerl.core.io import read_json, read_jsonl
    from tracerl.core.trajectory import Trajectory

    ws, seconds = retail_run
    print(f"\ntracerl run on live retail: {seconds:.0f} s")
    done = {p.stem for p in (ws / ".stages").glob("*.json")}
    assert {"collect", "select", "synthesize", "compose", "grpo_target", "eval:base", "eval:trace_moe",
            "eval:trace_router", "eval:grpo_target", "report"} <= done and any(s.startswith("train:") for s in done)
    splits = json.loads((DATA / "domains" / "retail" / "split_tasks.json").read_text())
    assert [t.task_id for t in read_jsonl(ws / "rollouts" / "base.jsonl", Trajectory)] == splits["train"][:6]
    target = read_json(next((ws / "envs").glob("*/target.json")))
    assert {"get_order_details", "cancel_pending_order"} <= {t["function"]["name"] for t in target["tools"]}
    for variant in ("base", "trace_moe", "trace_router", "grpo_target"):
        episodes = read_jsonl(ws / "eval" / f"{variant}.jsonl", Trajectory)
        assert sorted({t.task_id for t in episodes}) == sorted(splits["test"][:3]) and len(episodes) == 6
        ours = read_json(ws / "eval" / f"{variant}.json")
        theirs = tau2_metrics(tau2_python, tau2_data, ws / "eval" / "tau2" / f"{variant}.json")
        assert theirs["trials"] == 2 and sorted(theirs["tasks"]) == sorted(splits["test"][:3])
        assert {str(k): v for k, v in theirs["pass_hat_ks"].items()} == pytest.approx(ours["pass_k"])
        assert ours["grading"]["grader"] == "τ²-bench 1.0.1" and ours["grading"]["reward_basis"] == ["DB"]
    report = read_json(ws / "report" / "report.json")
    assert {"base", "trace_moe", "trace_router", "grpo_target"} <= set(report["evaluation"])
    assert "Graded live by τ²-bench 1.0.1: reward basis DB" in (ws / "report" / "index.html").read_text()


def tau2_run(tau2_python: str, tau2_data: str, agent_url: str, agent: str, user_url: str, save_to: str, cwd: Path,
             tasks: int = 1) -> list:
    """τ²-bench's own CLI on mock's first tasks, the agent and the user simulator on the given endpoints."""
    from tracerl.envs.tau2 import read_tau2_results

    def args(url: str, **more) -> str:
        return json.dumps({"api_base": url, "api_key": "x", "temperature": 0.0, "max_tokens": 32, **more})

    # the tiny agent stands in for the user simulator: it answers in text (a user's tool call would be its
    # airline habit, and a user calling tools to the step limit leaves the agent nothing to answer)
    user_args = args(user_url, tool_choice="none")
    command = [str(Path(tau2_python).parent / "tau2"), "run", "--domain", "mock", "--agent-llm", f"openai/{agent}",
               "--agent-llm-args", args(agent_url), "--user-llm", "openai/tiny-agent", "--user-llm-args", user_args,
               "--num-tasks", str(tasks), "--max-steps", "6", "--max-concurrency", "1", "--save-to", save_to]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "TAU2_DATA_DIR": tau2_data, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr[-2000:]
    return read_tau2_results(Path(tau2_data) / "simulations" / save_to / "results.json")


@pytest.mark.slow
def test_tau2_run_grades_a_served_adapter_router_and_moe(retail_run, tau2_python, tau2_data, served, tmp_path):
    """`tau2 run --agent-llm openai/<name>` against `tracerl serve` serving what the loop made: one
    adapter (by its name), the task router and the token-level MoE (routing inside the endpoint)."""
    from tracerl.models.composed.policy import composed_server_policy
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    ws, _ = retail_run
    cap = next(p.name for p in (ws / "adapters").iterdir() if (p / "adapter_config.json").exists())
    model, tokenizer = load_model("tiny-agent")
    with_adapter = LocalPolicy(model, tokenizer)
    with_adapter.load_adapter(cap, ws / "adapters" / cap)
    servers = [(with_adapter, "tiny-agent", cap)]
    for folder in ("composed", "composed_router"):
        policy, name = composed_server_policy(str(ws / folder), None, "raw_logprobs", None, [])
        servers.append((policy, name, name))
    for policy, served_name, agent in servers:
        with ServerThread(policy, served_model_name=served_name, max_batch_size=2) as server:
            [trajectory] = tau2_run(tau2_python, tau2_data, server.base_url, agent, served, f"served-{agent}", tmp_path)
        assert trajectory.termination in STOPS - {"infrastructure_error", "agent_error"}, (agent, trajectory.info)
        spoken = [m for m in trajectory.messages if m.role == "assistant"][1:]  # after τ²-bench's greeting
        assert spoken and all(m.content or m.tool_calls for m in spoken), agent


# --- bad input: one line, before any episode ---------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_domain(tau2_python, tau2_data):
    with pytest.raises(InputError, match="unknown τ²-bench domain 'nowhere'"):
        tau2_env("nowhere", tau2_python, tau2_data, "http://127.0.0.1:1/v1")


def test_tau2_not_installed(tau2_data):
    with pytest.raises(InputError, match="τ²-bench is not installed for") as e:
        tau2_env("mock", sys.executable, tau2_data, "http://127.0.0.1:1/v1")  # the test venv: Python 3.11, no τ²-bench
    assert "\n" not in str(e.value)


def test_unreachable_user_simulator(tau2_python, tau2_data):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(InputError, match=f"tau2.user: the endpoint {url} does not answer"):
        tau2_env("mock", tau2_python, tau2_data, url)


def test_nl_assertions_need_a_judge(tau2_python, tau2_data, served):
    with pytest.raises(InputError, match="112 of 114 tasks are graded with NL_ASSERTION, which needs a judge"):
        tau2_env("retail", tau2_python, tau2_data, served)
    env = tau2_env("retail", tau2_python, tau2_data, served, reward_basis=["DB"])  # a restricted basis needs none
    assert env.task_ids and env.settings.judge is None


def test_unknown_task_and_split(tau2_python, tau2_data, served):
    with pytest.raises(InputError, match="no task '999'"):
        tau2_env("mock", tau2_python, tau2_data, served, task_ids=["999"])
    with pytest.raises(InputError, match="tau2.splits names no task '999'"):
        tau2_env("mock", tau2_python, tau2_data, served, splits={"train": ["999"]})
    with pytest.raises(InputError, match="no split 'dev'"):
        tau2_env("retail", tau2_python, tau2_data, served, split="dev", reward_basis=["DB"])


def test_cli_exits_2_with_one_line(tau2_python, tau2_data, monkeypatch, capsys, tmp_path):
    from tracerl.cli import main

    monkeypatch.setenv("TRACERL_TAU2_PYTHON", tau2_python)
    monkeypatch.setenv("TAU2_DATA_DIR", tau2_data)
    settings = tmp_path / "tau2.yaml"
    settings.write_text("user: {model: x, base_url: 'http://127.0.0.1:1/v1'}\n")
    for flags, message in [(["--env", "tau2:nowhere"], "unknown τ²-bench domain 'nowhere'"),
                           (["--env", "tau2:mock", "--split", "train"], "tau2:mock: no split 'train' (its splits: base)")]:
        assert main(["collect", *flags, "--tau2", str(settings), "--tasks", "1", "--out", os.devnull]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


def test_splits_of_the_settings_and_their_task_seeds(tau2_python, tau2_data, served):
    splits = {"train": ["create_task_1", "update_task_1", "impossible_task_1"], "test": ["create_task_1_nl_eval"]}
    train = tau2_env("mock", tau2_python, tau2_data, served, split="train", splits=splits, reward_basis=["DB"])
    assert train.task_ids == splits["train"] and train.task_seeds(2, offset=1) == [1, 2]
    with pytest.raises(ValueError, match="tau2:mock has 3 tasks here; asked for 3 from offset 1"):
        train.task_seeds(3, offset=1)
    test = tau2_env("mock", tau2_python, tau2_data, served, split="test", splits=splits, reward_basis=["DB"])
    assert test.task_ids == splits["test"]


def test_gpu_recipe_loads():
    from tracerl.config import load_run_config
    from tracerl.envs.tau2_live import load_tau2_settings

    config = load_run_config(ROOT / "configs" / "tau2-retail.yaml")
    assert config.target.env == "tau2:retail" and (config.eval.temperature, config.eval.trials) == (0.0, 1)
    settings = load_tau2_settings(config.target.tau2)
    assert settings["user"]["base_url"] and settings["judge"]["base_url"] and settings["reward_basis"] is None
    assert settings["python"] == str(ROOT / ".venv-tau2" / "bin" / "python")
