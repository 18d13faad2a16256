"""Evaluation rollouts from OpenAI-compatible servers (`model.server_url`, `tracerl eval --server`).

The evaluated adapter reaches the servers as training's do (`tracerl.models.served.ServerBackend`:
a fresh copy of its files, unloaded then loaded on every server) and is checked as training checks
it (`tracerl.models.served.ServedCheck`): before any episode each server must answer, serve the
run's base model and report the log-probs of the distribution it samples from; after the swap, the
served adapter's next-token log-probs must equal those of the local model with the adapter on,
within the precision's tolerance (`TOLERANCES`) — else one line, exit 2, and no episode is played.
After the evaluation the adapter is unloaded and its copy removed.

Composed variants (MoE and router: several adapters in one model, chosen per token or per episode)
are no single LoRA a vLLM server can load: they are evaluated in-process, and the stage prints `LOCAL_NOTE` saying so
(an error would stop every run with a server before its main result).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from peft import PeftModel

from tracerl.core.errors import InputError
from tracerl.envs.base import Env
from tracerl.models.chat import ChatFormat
from tracerl.models.local import load_model
from tracerl.models.served import ServedCheck, ServerBackend, probe_prompts

LOCAL_NOTE = "{variant}: a composed model cannot be served by vLLM; evaluated in-process instead of on {url}"


@contextmanager
def served_policy(server_url: str, base: str, make_env: Callable[[], Env], *, adapter: tuple[str, Path] | None,
                  temperature: float, seed: int, max_new_tokens: int, batch_size: int, served_dir: Path,
                  api_key: str | None = None, dtype: str | None = None, device: str | None = None,
                  served_tolerance: float | None = None) -> Iterator[Any]:
    """A `RemotePolicy` over the servers, sampling with `adapter` ((name, PEFT directory); None: the base).
    The check's local model is loaded in `dtype` on `device` (`tracerl.models.placement` names): the
    servers' precision, whose tolerance the check applies unless `served_tolerance` is given.

    Sessions select the adapter by `name` (`Episode.adapter`); without one they get the base model.
    """
    model, tokenizer = load_model(base, device=device, dtype=dtype)
    if adapter is not None:
        name, path = adapter
        if not (Path(path) / "adapter_config.json").exists():
            raise InputError("not a PEFT adapter directory (no adapter_config.json)", path=str(path))
        model = PeftModel.from_pretrained(model, str(path), adapter_name=name)
        model.eval()
    check = ServedCheck(model, probe_prompts(make_env, ChatFormat(tokenizer)), temperature if temperature > 0 else 1.0,
                        tolerance=served_tolerance)
    backend = ServerBackend(server_url, tokenizer, adapter[0] if adapter else "", temperature=temperature,
                            max_new_tokens=max_new_tokens, api_key=api_key, max_concurrency=batch_size, check=check)
    try:
        backend.start()  # every server answers, serves the base, reports sampling log-probs
        if adapter is None:
            backend.adapter = check.base_model(backend.control, 0)
        else:
            backend.served_dir = served_dir
            backend.after_step(adapter[1])  # hot-swap on every server, then served = local (adapter on)
        yield backend.policy(greedy=temperature == 0, seed=seed)
    except BaseException:
        with suppress(Exception):  # also after a failed check; the error raised is the first one
            backend.close()
        raise
    backend.close()  # the servers keep no adapter of ours
