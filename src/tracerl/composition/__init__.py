"""TRACE step 4: compose the capability adapters into one model.

- `build`: `build_composition` (what `tracerl compose` runs) loads the base and the adapters, trains
  the gates (moe routed per token: `training`), fits them to the episodes' openings (moe routed at the
  opening: `opening_fit`) or calibrates the task router's label head (router, merge), measures
  held-out routing accuracy (`accuracy`) and writes a composed directory.
- `examples`, `losses`: gate-training examples from the adapters' rollouts, and the losses.
- `stage`: `run_compose`, the pipeline's compose stage (gate data rolled out, every mode composed).

The composed model itself — gated LoRA layers, routing, loading — is `tracerl.models.composed`.
"""
