"""Step 3 of TRACE: one LoRA adapter per capability, trained with multi-turn GRPO.

    from tracerl.training.config import TrainConfig
    from tracerl.training.run import build_trainer, resolve_env
    make_env, name, defaults = resolve_env("envs/precondition_verification")   # or "airline"
    trainer = build_trainer(TrainConfig(learning_rate=2e-3), "tiny-agent", make_env, "adapters/precondition")
    rows = trainer.train(resume=True)          # metrics rows; the adapter is a PEFT directory

Modules: `config` (TRL/PEFT-named options), `advantages`, `loss` (log-probs, clipped surrogate,
KL, TRL's loss normalisations), `sequences` (token records → training tables, hint stripping),
`trainer` (the GRPO loop), `checkpoint`, `distributed` (torchrun), `fsdp` (FSDP2 sharding),
`backends` (local rollouts; server rollouts with adapter hot-swap are `tracerl.models.served`),
`run` (wiring and input checks), `stage` (`run_train`: one run into a folder, resumed or refused
alike for `tracerl train` and the pipeline).
"""
