"""`tracerl compose` end to end on a tiny saved base: the composed directory, load_composed, sampling."""

from __future__ import annotations

import json

import pytest
import torch
from composition_helpers import make_adapter, save_base, tiny_model, toy_tokenizer
from contract_cases import capabilities_file
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tracerl.cli import main
from tracerl.composition.accuracy import prompts_from_trajectories, routing_accuracy
from tracerl.models.composed.artifact import load_composed
from tracerl.composition.build import split_heldout
from tracerl.models.composed.policy import ComposedPolicy
from tracerl.core.errors import InputError
from tracerl.core.io import read_jsonl, write_jsonl
from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.core.trajectory import Trajectory
from tracerl.models.local import LocalPolicy

REQUESTS = {
    "alpha": ["cancel my reservation please", "please cancel reservation 12", "cancel the reservation now"],
    "beta": ["look up the order status", "what is the order status of 7", "look up order 9 status"],
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("compose")
    tokenizer = toy_tokenizer()
    base = tiny_model(seed=0, vocab=len(tokenizer))
    base_dir = save_base(base, tokenizer, root / "base")
    adapters = [make_adapter(base, root / "adapters" / name, seed=i + 1, base_name=str(base_dir)) for i, name in enumerate(REQUESTS)]
    trajectories = [
        Trajectory(
            task_id=f"{name}-{k}", domain=f"env_{name}", seed=k, passed=True, reward=1.0, info={"capability": name},
            messages=[Message.system("You are a support agent."), Message.user(f"{text} (ticket {k})"), Message.assistant("done")],
        )
        for name, texts in REQUESTS.items() for k in range(8) for text in [texts[k % 3]]
    ]
    write_jsonl(root / "rollouts.jsonl", trajectories)
    capabilities_file(root / "capabilities.json", ["alpha", "beta"],
                      descriptions={"alpha": "cancelling reservations", "beta": "looking up orders"})
    return root, base_dir, adapters, tokenizer


def compose_cli(root, base_dir, adapters, out, *extra):
    return main(["compose", "--adapters", *map(str, adapters), "--base", str(base_dir), "--out", str(out),
                 "--capabilities", str(root / "capabilities.json"), "--trajectories", str(root / "rollouts.jsonl"), *extra])


def test_compose_moe_writes_a_loadable_directory(workspace, capsys):
    root, base_dir, adapters, tokenizer = workspace
    out = root / "composed-moe"
    assert compose_cli(root, base_dir, adapters, out, "--mode", "moe", "--moe-routing", "token", "--max-steps", "40",
                       "--learning-rate", "0.05", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    spec = json.loads((out / "composition.json").read_text())
    assert printed == spec
    assert spec["slots"] == ["base", "alpha", "beta"] and spec["model_name"] == "composed-moe"
    assert [(c["name"], c["description"]) for c in spec["capabilities"]] == [("alpha", "cancelling reservations"), ("beta", "looking up orders")]
    assert spec["gate_parameters"] == 2 * (32 * 3 + 3)
    assert spec["adapters"][0]["path"] == "../adapters/alpha" and spec["base"] == "../base"
    assert spec["gate_training"]["examples"] > 0 and spec["gate_training"]["final"]["step"] == 40
    accuracy = spec["routing_accuracy"]
    assert accuracy["num_prompts"] == 4 and set(accuracy["per_capability"]) == {"alpha", "beta"}
    gates = load_file(str(out / "gates.safetensors"))
    assert sorted(gates) == ["gates.0.bias", "gates.0.weight", "gates.1.bias", "gates.1.weight"]

    model = load_composed(out)
    composition = model.tracerl_composition
    assert torch.equal(composition.gates[1].weight, gates["gates.1.weight"])
    _, heldout = split_heldout(read_jsonl(root / "rollouts.jsonl", Trajectory), 0.2, 0)
    assert routing_accuracy(composition, tokenizer, prompts_from_trajectories(heldout)) == accuracy
    # pluggable into the local backend: an HF causal LM with a working KV cache
    policy = LocalPolicy(model, tokenizer, max_new_tokens=5, seed=0)
    sessions = [Session(messages=[Message.system("s"), Message.user(t)], tools=[]) for t in ("cancel my reservation", "look up the order")]
    replies = policy.act(sessions)
    assert len(replies) == 2 and all(s.tokens is not None and sum(s.tokens.mask) >= 1 for s in sessions)


def test_compose_router_mode_and_composed_policy(workspace):
    root, base_dir, adapters, _ = workspace
    out = root / "composed-router"
    assert compose_cli(root, base_dir, adapters, out, "--mode", "router") == 0
    spec = json.loads((out / "composition.json").read_text())
    assert spec["mode"] == "router" and spec["router"]["labels"] == ["A", "B", "C"] and spec["gate_parameters"] == 0
    assert not (out / "gates.safetensors").exists()
    # the label head was calibrated on the training requests (the random base alone routes them all alike)
    assert spec["router"]["kind"] == "label-head" and (out / "router_head.safetensors").exists()
    assert spec["router"]["fit"]["train_accuracy"] == 1.0 and spec["router"]["fit"]["requests"] == 12
    assert spec["routing_accuracy"]["overall"] == 1.0
    model = load_composed(out)
    _, heldout = split_heldout(read_jsonl(root / "rollouts.jsonl", Trajectory), 0.2, 0)
    assert routing_accuracy(model.tracerl_composition, model.tracerl_tokenizer, prompts_from_trajectories(heldout)) == spec["routing_accuracy"]
    policy = ComposedPolicy(model, max_new_tokens=4, seed=0, name="composed-router")
    sessions = [Session(messages=[Message.system("s"), Message.user(t)], tools=[], adapter="composed-router") for t in ("cancel it", "order status")]
    assert len(policy.act(sessions)) == 2
    for s in sessions:
        assert set(s.info["routing"]) == {"base", "alpha", "beta"} and sorted(s.info["routing"].values()) == [0.0, 0.0, 1.0]
    sessions[0].messages += [Message.assistant("ok"), Message.user("thanks")]
    routing = dict(sessions[0].info["routing"])
    policy.act(sessions[:1])  # a later turn keeps the session's route
    assert sessions[0].info["routing"] == routing


def test_compose_zero_shot_router(workspace):
    root, base_dir, adapters, _ = workspace
    out = root / "composed-zero-shot"
    assert compose_cli(root, base_dir, adapters, out, "--mode", "merge", "--zero-shot") == 0
    spec = json.loads((out / "composition.json").read_text())
    assert spec["router"]["kind"] == "zero-shot" and spec["router"]["fit"] is None
    assert not (out / "router_head.safetensors").exists()


def test_compose_bad_input_exits_2_and_writes_nothing(workspace, capsys):
    root, base_dir, adapters, _ = workspace
    out = root / "never"
    assert compose_cli(root, base_dir, adapters[:1], out) == 2
    err = capsys.readouterr().err
    assert "no adapter for ['beta']" in err and len(err.strip().splitlines()) == 1
    assert not (out / "composition.json").exists()
    assert main(["compose", "--adapters", str(adapters[0]), "--base", str(base_dir), "--out", str(out), "--mode", "mixture"]) == 2
    assert main(["serve", "--router", str(out), "--upstream", "http://127.0.0.1:9/v1"]) == 2  # not a composed directory
    assert "no composition.json" in capsys.readouterr().err
    assert compose_cli(root, base_dir, adapters, out, "--lr-scheduler-type", "step") == 2
    assert "bad gate-training option: field 'lr_scheduler_type'" in capsys.readouterr().err
    assert compose_cli(root, base_dir, adapters, out, "--moe-routing", "sometimes") == 2
    err = capsys.readouterr().err
    assert "bad option: field 'moe_routing'" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("mode", ["moe", "moe-opening", "merge"])
def test_serve_a_composed_model_over_the_openai_api(workspace, mode):
    """`tracerl serve --model COMPOSED_DIR` builds this policy; the app serves it under its own name
    (a moe composition routed at the opening routes each request from its prompt's opening)."""
    from fastapi.testclient import TestClient

    from tracerl.models.composed.policy import composed_server_policy
    from tracerl.serve.app import create_app
    from tracerl.serve.engine import Engine

    root, base_dir, adapters, _ = workspace
    out = root / f"served-{mode}"
    options = {"moe-opening": ["--mode", "moe"], "moe": ["--mode", "moe", "--moe-routing", "token"]}.get(mode, ["--mode", mode])
    assert compose_cli(root, base_dir, adapters, out, *options, "--max-steps", "2", "--name", f"trace-{mode}") == 0
    assert json.loads((out / "composition.json").read_text())["moe_routing"] == {"moe": "token", "moe-opening": "opening"}.get(mode)
    policy, name = composed_server_policy(str(out), "cpu", "raw_logprobs", None, [])
    assert policy.composition.moe_routing == ("opening" if mode == "moe-opening" else "token")
    assert name == f"trace-{mode}"
    engine = Engine(policy, max_batch_size=4)
    try:
        client = TestClient(create_app(engine, served_model_name=name))
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [name]
        body = {"model": name, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "cancel my reservation"}],
                "max_tokens": 3, "temperature": 0, "n": 2}
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["choices"]) == 2 and reply.json()["usage"]["completion_tokens"] >= 2
        assert client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapters[0])}).status_code == 400
    finally:
        engine.close()
    with pytest.raises(InputError, match="--lora cannot be combined"):
        composed_server_policy(str(out), "cpu", "raw_logprobs", None, [("x", str(adapters[0]))])


def test_router_proxy_in_front_of_a_one_lora_per_request_server(workspace):
    """The proxy routes requests for the composed name to the chosen adapter of the upstream server
    (here `tracerl serve` with the adapters loaded by name, as vLLM's --lora-modules would)."""
    from fastapi.testclient import TestClient

    from tracerl.serve.proxy import create_router_proxy
    from tracerl.serve.server import ServerThread

    root, base_dir, adapters, tokenizer = workspace
    out = root / "composed-proxy"
    assert compose_cli(root, base_dir, adapters, out, "--mode", "router", "--name", "trace") == 0
    composition = load_composed(out).tracerl_composition
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(str(base_dir)).eval(), tokenizer)
    for path in adapters:
        policy.load_adapter(path.name, str(path))
    with ServerThread(policy, served_model_name="base") as upstream:
        proxy = TestClient(create_router_proxy(composition, upstream.base_url, served_model_name="trace", upstream_base_name="base"))
        assert [m["id"] for m in proxy.get("/v1/models").json()["data"]] == ["base", "alpha", "beta", "trace"]
        for text, adapter in (("cancel my reservation please (ticket 99)", "alpha"), ("look up the order status (ticket 98)", "beta")):
            messages = [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": text}]
            routed = proxy.post("/v1/chat/completions", json={"model": "trace", "messages": messages, "max_tokens": 4, "temperature": 0})
            assert routed.status_code == 200, routed.text
            assert routed.headers["x-tracerl-route"] == adapter and routed.json()["model"] == "trace"
            direct = proxy.post("/v1/chat/completions", json={"model": adapter, "messages": messages, "max_tokens": 4, "temperature": 0})
            assert direct.json()["model"] == adapter
            assert direct.json()["choices"][0]["message"] == routed.json()["choices"][0]["message"]


def test_compose_fits_the_opening_gates_to_the_target_openings_the_selection_labelled(workspace, capsys):
    """`--target-rollouts` with the selection's capabilities.json (n = k = 1) and its labels/ beside
    it: each failed rollout that lacked an adapter's capability joins the fit; a passed one, or one
    that lacked none of them, does not."""
    from tracerl.contracts import LabelRun, PairLabel, TrajectoryLabels

    root, base_dir, adapters, _ = workspace
    selection = root / "selection"
    capabilities_file(selection / "capabilities.json", ["alpha", "beta"], ["gamma"])
    rows = [("t0", False, "alpha"), ("t1", False, "beta"), ("t2", True, "alpha"), ("t3", False, "gamma"), ("t4", False, "beta")]
    rollouts = [Trajectory(task_id=t, domain="target", passed=passed, messages=[Message.user(f"refund ticket {t}")])
                for t, passed, _ in rows]
    write_jsonl(root / "target.jsonl", rollouts)
    run = LabelRun(run=0, seed=0, labeler="rules", capabilities=["alpha", "beta", "gamma"], trajectories=[
        TrajectoryLabels(index=i, task_id=t, passed=passed,
                         labels={c: PairLabel(label="LACKING" if c == lacked else "PRESENT") for c in ("alpha", "beta", "gamma")})
        for i, (t, passed, lacked) in enumerate(rows)])
    (selection / "labels").mkdir()
    (selection / "labels" / "run_00.json").write_text(run.model_dump_json())

    def compose(out, *extra):
        return main(["compose", "--adapters", *map(str, adapters), "--base", str(base_dir), "--out", str(out),
                     "--trajectories", str(root / "rollouts.jsonl"), "--target-rollouts", str(root / "target.jsonl"), *extra])

    capabilities = ["--capabilities", str(selection / "capabilities.json")]
    out = root / "composed-target"
    assert compose(out, *capabilities, "--mode", "moe", "--moe-routing", "opening", "--max-steps", "5") == 0
    assert json.loads((out / "composition.json").read_text())["gate_training"]["target_openings"] == 3  # t0, t1, t4
    capsys.readouterr()
    never = root / "never-target"
    assert compose(never, *capabilities, "--mode", "moe", "--moe-routing", "token") == 2
    assert "fits only the gates of --mode moe --moe-routing opening" in capsys.readouterr().err
    assert compose(never, "--mode", "moe", "--moe-routing", "opening") == 2
    assert "--target-rollouts needs --capabilities" in capsys.readouterr().err
    assert not never.exists()
