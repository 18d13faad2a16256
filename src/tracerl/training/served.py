"""The served policy is the trained policy: checks of a rollout server, at start-up and after every hot-swap.

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
must equal the trainer's (adapter on) within `TOLERANCE` nats, or training stops with
`ServedPolicyMismatch`. The tolerance is far above float32 kernel noise (two engines computing
the same float32 model agree to ~1e-5 nats) and far below what one optimizer step moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tracerl.core.errors import InputError
from tracerl.envs.base import Env

TOLERANCE = 2e-3  # nats
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
                 tolerance: float = TOLERANCE):
        self.model, self.prompts, self.temperature, self.tolerance = model, prompts, temperature, tolerance
        self.last_difference: list[float] = []  # per server, after the latest swap

    def base_model(self, remote: Any, server: int) -> str:
        """The server's base model name (the /v1/models entry without a parent); unreachable → InputError."""
        from tracerl.models.remote import RemotePolicyError

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
        from tracerl.models.remote import RemotePolicyError

        raw = local_logprobs(self.model, self.prompts, 1.0, adapter=False)
        scaled = local_logprobs(self.model, self.prompts, MODE_TEMPERATURE, adapter=False)
        for server, url in enumerate(remote.base_urls):
            base = self.base_model(remote, server)
            try:
                served = remote.next_token_logprobs(self.prompts, base, temperature=MODE_TEMPERATURE, top=TOP,
                                                    server=server)
            except RemotePolicyError as e:
                raise InputError(f"{url}: the server cannot score the probe: {_first_line(e)}") from None
            if max_difference(served, scaled) <= self.tolerance:
                continue
            if max_difference(served, raw) <= self.tolerance:
                raise InputError(f"{url}: the server reports raw log-probs, not those of the distribution it samples "
                                 "from; start it with --logprobs-mode processed_logprobs")
            raise InputError(f"{url}: the served model '{base}' is not the trainer's base (next-token log-probs differ "
                             f"by up to {max_difference(served, scaled):.3g} nats)")

    def after_swap(self, remote: Any, adapter: str, label: str) -> None:
        """The adapter served on every server gives the trainer's log-probs, or `ServedPolicyMismatch`."""
        from tracerl.models.remote import RemotePolicyError

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
            if diff > self.tolerance:
                raise ServedPolicyMismatch(
                    f"{url}: the served adapter '{adapter}' is not the trained one {label}: next-token log-probs "
                    f"differ by up to {diff:.3g} nats (tolerance {self.tolerance:g}); the server did not load the "
                    "adapter just saved (is the checkpoint folder readable by the server?)")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
