"""Composed models at inference: N capability LoRA adapters in one causal LM, routed.

- `composition`: `compose(model, adapters, …)` puts a `GatedLoRALinear` (`layers`) on every adapted
  linear and returns a `Composition`; routing is per call (`routed`, `ComposedModel`): token-level
  gates (moe), each episode's opening (moe routed at the opening), or the task router (`router`:
  top-1 "router", top-p weighted "merge").
- `adapters`: PEFT LoRA directories read as plain tensors and checked against the base.
- `artifact`: the composed-model directory (`load_composed`, `save_composed`).
- `policy`: `ComposedPolicy`, sampling from a composed model in process.
- `examples`: a conversation's opening as token ids with its label mask (what the gates route on).
- `merge`: adapters merged into a plain model's weights.

Training the gates and building a composed directory is step 4's stage, `tracerl.composition`.
"""
