"""Wiring: a base model + LoRA + rollout backend + environment → a ready `GRPOTrainer`.

Everything that can be wrong with the inputs (environment, base model, starting adapter) is
checked here, before any training starts, and reported as a one-line `InputError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peft import PeftConfig, PeftModel, get_peft_model

from tracerl.core.errors import InputError
from tracerl.envs.base import Env
from tracerl.envs.registry import env_factory
from tracerl.envs.registry import make_env as make_registered
from tracerl.envs.synthetic.checks import validate_env
from tracerl.envs.synthetic.envdir import (
    ENV_JSON,
    load_env_dir,
    load_env_spec,
    load_target_json,
)
from tracerl.models.chat import ChatFormat
from tracerl.models.importing import GGUF_BASE, TEMPLATE_ADVICE
from tracerl.models.local import LocalPolicy, load_model, resolve_model_path
from tracerl.models.placement import dtype_name, resolve_device
from tracerl.models.served import ServedCheck, ServerBackend, probe_prompts
from tracerl.training.backends import LocalBackend
from tracerl.training.config import TrainConfig
from tracerl.training.distributed import World
from tracerl.training.fsdp import shard_model
from tracerl.training.trainer import GRPOTrainer

ADAPTER_NAME = "default"


def device_for(world: World, device: str | None = None) -> torch.device:
    """Where this rank trains: under torchrun (several ranks), cuda:LOCAL_RANK of the visible GPUs when there
    are GPUs, else the CPU; one process, `device` (a `tracerl.models.placement` name, default "auto")."""
    if world.size > 1:
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", world.rank)) % torch.cuda.device_count())
        return torch.device("cpu")
    return resolve_device(device)


def load_base(base: str | Path, device: torch.device | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of a plain base model; a PEFT adapter directory is refused (pass it as init_adapter)."""
    path = Path(resolve_model_path(base))
    if (path / "adapter_config.json").exists():
        raise InputError(f"{base}: is a LoRA adapter, not a base model (start from it with --adapter)")
    if path.suffix == ".gguf":
        raise InputError(f"{base}: {GGUF_BASE}")
    model, tokenizer = load_model(base, device=device, dtype=dtype)
    if getattr(tokenizer, "chat_template", None) is None:
        raise InputError(f"{base}: the tokenizer has no chat template")
    problem = ChatFormat(tokenizer).tool_rendering_problem()
    if problem is not None:
        raise InputError(f"{base}: {problem}; {TEMPLATE_ADVICE}")
    return model, tokenizer


def attach_lora(model: Any, config: TrainConfig, init_adapter: str | Path | None = None) -> Any:
    """The PEFT model to train: a fresh LoRA (seeded) or `init_adapter`, checked against the base."""
    if init_adapter is None:
        peft_config = config.lora.peft_config_for(model)  # an InputError names targets the base lacks
        torch.manual_seed(config.seed)
        return get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    directory = Path(init_adapter)
    if not (directory / "adapter_config.json").exists():
        raise InputError(f"{directory}: not a PEFT adapter directory (no adapter_config.json)")
    try:
        peft_config = PeftConfig.from_pretrained(str(directory))
        if getattr(peft_config, "peft_type", None) is None or str(peft_config.peft_type).split(".")[-1] != "LORA":
            raise ValueError("not a LoRA adapter")
        return PeftModel.from_pretrained(model, str(directory), adapter_name=ADAPTER_NAME, is_trainable=True)
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{directory}: adapter does not fit the base model: {first[:300]}") from None


def enable_activation_checkpointing(model: Any) -> None:
    """Each decoder layer recomputed in backward (non-reentrant: the LoRA inputs need no grad flag), by
    transformers' own switch (its name since 5.x, the older one before)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_env(make_env: Callable[[], Env], source: str) -> None:
    """One reset of the environment, so a broken environment fails before training."""
    try:
        env = make_env()
        messages, _ = env.reset(seed=0)
        env.tools  # noqa: B018 — schemas must build
    except InputError:
        raise
    except Exception as e:  # an environment that cannot reset is bad input for training
        raise InputError(f"{source}: the environment fails to reset: {type(e).__name__}: {e}") from None
    if not messages:
        raise InputError(f"{source}: the environment's reset returns no messages")


def build_trainer(
    config: TrainConfig,
    base: str | Path,
    make_env: Callable[[], Env],
    out: str | Path,
    *,
    env_source: str = "env",
    env_digest: str | None = None,
    world: World = World(),
    init_adapter: str | Path | None = None,
    server_url: str | None = None,
    served_model: str | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    make_eval_env: Callable[[], Env] | None = None,
    dtype: str | None = None,
    device: str | None = None,
    served_tolerance: float | None = None,
) -> GRPOTrainer:
    """Check every input, then assemble the trainer (rollouts local, or from `server_url`); held-out
    evaluation plays `make_eval_env`'s environments (default: `make_env`'s). `env_source` and
    `env_digest` (`synthesis.envdir.env_digest`) are recorded in train_config.json, with the precision
    the base was loaded in (`dtype`, a `tracerl.models.placement` name; `device`: see `device_for`).
    `served_tolerance`: the served-policy check's, in nats (None: the precision's)."""
    sharded = config.shard == "fsdp2" and world.size > 1
    if sharded and server_url is None:
        raise InputError("shard: fsdp2 samples its rollouts on servers: in-process sampling would gather the whole "
                         "model on every GPU. Serve the base with vLLM (--enable-lora) and give its URL "
                         "(model.server_url in a run config, --server for tracerl train); docs/gpu.md")
    check_env(make_env, env_source)
    model, tokenizer = load_base(base, torch.device("cpu") if sharded else device_for(world, device), dtype=dtype)
    peft_model = attach_lora(model, config, init_adapter)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(peft_model.get_base_model())
    if sharded:  # every rank built the same adapter (seeded), so each keeps its slice of one model
        shard_model(peft_model, world, device_for(world))
    chat = ChatFormat(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else chat.end_of_turn_id

    if server_url is None:
        def make_policy(greedy: bool, seed: int):
            return LocalPolicy(peft_model, tokenizer, temperature=0.0 if greedy else config.rollout.temperature, seed=seed,
                               max_new_tokens=config.rollout.max_new_tokens, logprobs_mode="processed_logprobs",
                               max_batch_size=config.rollout.batch_size, kv_cache_tokens=config.rollout.kv_cache_tokens)
        backend: LocalBackend | ServerBackend = LocalBackend(make_policy, adapter=ADAPTER_NAME)
    else:
        backend = ServerBackend(server_url, tokenizer, served_model or ADAPTER_NAME, temperature=config.rollout.temperature,
                                max_new_tokens=config.rollout.max_new_tokens, api_key=os.environ.get("OPENAI_API_KEY"),
                                max_concurrency=config.rollout.batch_size)
        backend.check = ServedCheck(peft_model, probe_prompts(make_env, chat), backend.temperature,
                                    tolerance=served_tolerance)
        backend.served_dir = Path(out) / "served_adapters"
        backend.start()  # servers answer, serve a base model, report sampling log-probs: before any rollout
    run_info = {"base": str(base), "env": env_source, "env_digest": env_digest, "init_adapter": None if init_adapter is None else str(init_adapter),
                "rollouts": "local" if server_url is None else server_url, "world_size": world.size,
                "dtype": dtype_name(model)}
    return GRPOTrainer(config, peft_model, make_env, backend, chat.prompt_ids, out, pad_id=pad_id, world=world, run_info=run_info,
                       on_step=on_step, make_eval_env=make_eval_env)


def resolve_env(spec: str | Path) -> tuple[Callable[[], Env], str, dict[str, Any]]:
    """`--env` → (factory, name, defaults): a synthesized env directory (validated) or a registered env name.

    `defaults` are training options the environment states (a synthetic env's `hint_fraction`).
    """
    path = Path(spec)
    if path.is_dir():

        env_spec = load_env_spec(path)
        make_env = load_env_dir(path)
        check_env(make_env, str(path))
        report = validate_env(make_env, list(load_target_json(path).tools))
        if not report.passed:
            first = report.failures().splitlines()[0]
            raise InputError(f"{path}: the environment fails validation: {first}")
        return make_env, env_spec.capability, {"hint_fraction": env_spec.hint_fraction}

    name = str(spec)
    try:
        env_factory(name)
    except InputError as e:
        raise InputError(f"--env {name}: neither an environment directory nor a known environment ({e})") from None
    factory = lambda: make_registered(name)  # noqa: E731
    check_env(factory, name)
    return factory, name, {}


def capability_dirs(root: str | Path) -> list[Path]:
    """The synthesized environment directories under `root` (those holding an env.json), sorted."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"--env {root}: not a directory")
    found = sorted(p for p in root.iterdir() if (p / ENV_JSON).exists())
    if not found:
        raise InputError(f"--env {root}: no environment directories (with {ENV_JSON}) inside")
    return found
