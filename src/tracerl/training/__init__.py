"""Step 3 of TRACE: one LoRA adapter per capability, trained with multi-turn GRPO.

    from tracerl.training import TrainConfig, build_trainer, resolve_env
    make_env, name, defaults = resolve_env("envs/precondition_verification")   # or "airline"
    trainer = build_trainer(TrainConfig(learning_rate=2e-3), "tiny-agent", make_env, "adapters/precondition")
    rows = trainer.train(resume=True)          # metrics rows; the adapter is a PEFT directory

Modules: `config` (TRL/PEFT-named options), `advantages`, `loss` (log-probs, clipped surrogate,
KL, TRL's loss normalisations), `sequences` (token records → training tables, hint stripping),
`trainer` (the GRPO loop), `checkpoint`, `distributed` (torchrun), `backends` + `remote`
(local or OpenAI-compatible server rollouts with adapter hot-swap), `run` (wiring and input
checks), `stage` (`run_train`: one run into a folder, resumed or refused alike for `tracerl train`,
its command in `commands`, and the pipeline).
"""

_EXPORTS = {
    "GRPOTrainer": "tracerl.training.trainer", "LoraSettings": "tracerl.training.config",
    "TrainConfig": "tracerl.training.config", "load_config": "tracerl.training.config",
    "build_trainer": "tracerl.training.run", "resolve_env": "tracerl.training.run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):  # lazy: `tracerl --help` need not import torch
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
