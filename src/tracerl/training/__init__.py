"""Step 3 of TRACE: one LoRA adapter per capability, trained with multi-turn GRPO.

    from tracerl.training import TrainConfig, build_trainer, resolve_env
    make_env, name, defaults = resolve_env("envs/precondition_verification")   # or "airline"
    trainer = build_trainer(TrainConfig(learning_rate=2e-3), "tiny-agent", make_env, "adapters/precondition")
    rows = trainer.train(resume=True)          # metrics rows; the adapter is a PEFT directory

Modules: `config` (TRL/PEFT-named options), `advantages`, `loss` (log-probs, clipped surrogate,
KL, TRL's loss normalisations), `sequences` (token records → training tables, hint stripping),
`trainer` (the GRPO loop), `checkpoint`, `distributed` (torchrun), `backends` + `remote`
(local or OpenAI-compatible server rollouts with adapter hot-swap), `run` (wiring and input
checks), `commands` (`tracerl train`).
"""

from tracerl.training.config import LoraSettings, TrainConfig, load_config
from tracerl.training.run import build_trainer, resolve_env
from tracerl.training.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "LoraSettings", "TrainConfig", "build_trainer", "load_config", "resolve_env"]
