"""Train the token-level gates of a moe composition; base model and adapters stay frozen.

Objective per batch (Switch Transformer style):

    loss = lm_loss_coef · LM loss (the model's own tokens, through the routed model)
         + router_aux_loss_coef · mean over layers of the load-balancing loss
         + label_loss_coef · mean over layers of the label loss toward the sequence's capability
           (on the label-masked tokens: the episode's opening, see `tracerl.composition.examples`)

In training mode the chosen expert's output is scaled by its gate probability, so the LM loss
reaches the gates — except on the label-masked tokens (unless `lm_loss_on_labelled`): there the
scale is detached and the label loss alone sets their route, so the LM loss of what follows cannot
pull an opening toward another capability's adapter. The learning rate follows
`lr_scheduler_type` (transformers' schedules). Each logged step reports the losses, the learning
rate, the routing entropy, the per-slot load (fraction of label-masked tokens routed to each slot,
all layers together) and the token-level routing accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from transformers import get_scheduler

from tracerl.composition.losses import (
    expert_load,
    label_loss,
    load_balancing_loss,
    routing_entropy,
)
from tracerl.core.errors import InputError
from tracerl.models.composed.composition import Composition
from tracerl.models.composed.examples import GateExample, pad_batch


class GateTrainingConfig(BaseModel):
    """Gate-training knobs (names follow TRL/HF where one exists)."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(1e-2, gt=0)
    # HF's default: decay linearly to 0, so the gates end settled rather than at a noisy last step
    lr_scheduler_type: Literal["linear", "cosine", "constant"] = "linear"
    warmup_steps: int = Field(0, ge=0)
    max_steps: int = Field(100, ge=1)
    per_device_train_batch_size: int = Field(8, ge=1)
    router_aux_loss_coef: float = Field(0.001, ge=0)  # λ_LB, as HF MoE configs call it
    label_loss_coef: float = Field(1.0, ge=0)
    lm_loss_coef: float = Field(1.0, ge=0)
    lm_loss_on_labelled: bool = False
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    logging_steps: int = Field(10, ge=1)
    seed: int = 0


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the target tokens where loss_mask is 1."""
    targets, weights = input_ids[:, 1:], loss_mask[:, 1:].float()
    per_token = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none")
    return (per_token * weights).sum() / weights.sum().clamp(min=1.0)


def train_gates(
    composition: Composition,
    examples: list[GateExample],
    config: GateTrainingConfig | None = None,
    *,
    on_log: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train the gates in place; returns the logged metrics (one dict per logging step)."""
    config = config or GateTrainingConfig()
    if composition.mode != "moe" or composition.gates is None:
        raise InputError("only a moe composition has gates to train")
    if not examples:
        raise InputError("no gate-training examples (no successful trajectories?)")
    if any(not 0 <= e.slot < composition.num_slots for e in examples):
        raise InputError(f"an example's slot is outside 0..{composition.num_slots - 1}")
    model, gates = composition.model, composition.gates
    composition.assert_frozen()
    device = next(gates.parameters()).device
    optimizer = torch.optim.AdamW(gates.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=config.max_steps)
    generator = torch.Generator().manual_seed(config.seed)
    was_training = model.training
    model.eval()
    gates.train()
    history: list[dict] = []
    try:
        for step in range(1, config.max_steps + 1):
            picks = torch.randint(len(examples), (config.per_device_train_batch_size,), generator=generator).tolist()
            batch = {k: v.to(device) for k, v in pad_batch([examples[i] for i in picks]).items()}
            label_tokens = batch["label_mask"].bool() & batch["attention_mask"].bool()
            labelled = None if config.lm_loss_on_labelled else label_tokens
            with composition.routing(record=True, labelled=labelled) as call:
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            layer_logits = call.gate_logits
            lm = lm_loss(out.logits, batch["input_ids"], batch["loss_mask"] * batch["attention_mask"])
            lb = torch.stack([load_balancing_loss(l, batch["attention_mask"]) for l in layer_logits]).mean()
            lab = torch.stack([label_loss(l, batch["slots"], label_tokens) for l in layer_logits]).mean()
            loss = config.lm_loss_coef * lm + config.router_aux_loss_coef * lb + config.label_loss_coef * lab
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(gates.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            if step % config.logging_steps == 0 or step == config.max_steps:
                record = _metrics(step, loss, lm, lb, lab, layer_logits, batch["slots"], label_tokens)
                record["learning_rate"] = scheduler.get_last_lr()[0]  # the rate the next step would use
                history.append(record)
                if on_log is not None:
                    on_log(record)
    finally:
        gates.train(was_training)
        model.train(was_training)
    composition.assert_frozen()
    return history


@torch.no_grad()
def _metrics(step, loss, lm, lb, lab, layer_logits, slots, label_tokens) -> dict:
    stacked = torch.cat([l.detach() for l in layer_logits], dim=0)
    mask = label_tokens.repeat(len(layer_logits), 1)
    targets = slots.repeat(len(layer_logits))[:, None].expand(mask.shape)
    correct = (stacked.argmax(dim=-1) == targets)[mask.bool()]
    return {
        "step": step,
        "loss": float(loss),
        "lm_loss": float(lm),
        "load_balancing_loss": float(lb),
        "label_loss": float(lab),
        "routing_entropy": float(routing_entropy(stacked, mask)),
        "expert_load": [round(float(x), 4) for x in expert_load(stacked, mask)],
        "token_routing_accuracy": float(correct.float().mean()),
    }
