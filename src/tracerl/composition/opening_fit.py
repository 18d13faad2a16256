"""The gates of a moe composition routed at the opening, fitted layer by layer to the openings.

Routed at the opening, the gates decide one thing: which adapter an episode gets
(`tracerl.composition.accuracy.prompt_slot` of their per-token votes). So they are fitted to that
alone, on openings (system prompt + first user turn; the label mask from the user turn on): each
environment's, toward its capability, and each failed target episode's, toward the capabilities its
episode lacked (split evenly: `GateExample.target`). Fitted to the environments' alone, the gates
send a target task to whichever environment's openings it resembles, which need not be the one
whose capability its failures lack (benchmarks/README.md, "The demo end to end"). One layer at a
time from the first: the layer's inputs on the label-masked tokens are collected with
the layers below routing by their gates already fitted, and the layer's gate is fitted full-batch
to the tokens' target weights (multinomial logistic regression on the RMS-normalised hidden state, L-BFGS,
a small ridge). No minibatch is drawn, so the fit is deterministic, and it runs to convergence:
the Switch objective's 100 minibatch steps left the label loss at ~1.06 and routed one capability
0% or 100% depending on the gate seed (benchmarks/README.md, "Composition: routing and composed
success").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tracerl.composition.training import GateTrainingConfig
from tracerl.core.errors import InputError
from tracerl.models.composed.composition import Composition, rms_normalised
from tracerl.models.composed.examples import GateExample, pad_batch

RIDGE = 1e-3  # × mean squared gate weight: keeps the fit finite where the openings are separable


class _Collected(Exception):
    """Raised by the capture hook once the layer's input is kept: the layers above need not run."""


@torch.no_grad()
def layer_inputs(composition: Composition, examples: list[GateExample], index: int,
                 batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, targets): the RMS-normalised input of decoder layer `index` on every label-masked
    token of `examples` (the layers below routing by their gates), and each token's target weights
    over the slots (its example's `target_row`)."""
    model, gate = composition.model, composition.gates[index]
    device = next(model.parameters()).device
    features, targets = [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = pad_batch(chunk)
        mask = (batch["label_mask"].bool() & batch["attention_mask"].bool()).to(device)
        kept: list[torch.Tensor] = []

        def capture(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            kept.append(rms_normalised(hidden.to(gate.weight.dtype))[mask])
            raise _Collected

        handle = composition.layers[index].register_forward_pre_hook(capture, with_kwargs=True)
        try:
            with composition.routing():
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device), use_cache=False)
        except _Collected:
            pass
        finally:
            handle.remove()
        features.append(kept[0])
        rows = torch.tensor([e.target_row(composition.num_slots) for e in chunk], dtype=gate.weight.dtype, device=device)
        targets.append(rows[:, None, :].expand(*mask.shape, rows.shape[-1])[mask])
    return torch.cat(features), torch.cat(targets)


def fit_gate(gate: torch.nn.Linear, features: torch.Tensor, targets: torch.Tensor, max_iter: int) -> dict:
    """Fit `gate` in place: full-batch cross-entropy toward `targets` (tokens × slots, each row a
    distribution) + RIDGE · mean(W²), L-BFGS from zero. A token counts as routed right when its
    argmax slot is one of its most-wanted slots."""
    with torch.no_grad():
        gate.weight.zero_()
        gate.bias.zero_()
    optimizer = torch.optim.LBFGS(gate.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(gate(features), targets) + RIDGE * gate.weight.pow(2).mean()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    with torch.no_grad():
        logits = gate(features)
        wanted = targets.gather(1, logits.argmax(dim=-1, keepdim=True)).squeeze(1)
        return {"label_loss": float(F.cross_entropy(logits, targets)),
                "token_routing_accuracy": float((wanted >= targets.max(dim=-1).values).float().mean()),
                "tokens": int(targets.shape[0])}


def fit_gates_to_openings(composition: Composition, examples: list[GateExample], config: GateTrainingConfig,
                          on_log: Callable[[dict], None] | None = None) -> list[dict]:
    """Fit every gate of `composition` to the openings in `examples` (see the module docstring);
    `config.max_steps` bounds each layer's L-BFGS iterations. Returns one record per layer."""
    if composition.mode != "moe" or composition.gates is None:
        raise InputError("only a moe composition has gates to fit")
    if not examples or not any(any(e.label_mask) for e in examples):
        raise InputError("no openings to fit the gates to")
    model = composition.model
    was_training = model.training
    model.eval()
    history = []
    try:
        for index, gate in enumerate(composition.gates):
            features, targets = layer_inputs(composition, examples, index)
            record = {"layer": index, **fit_gate(gate, features, targets, config.max_steps)}
            history.append(record)
            if on_log is not None:
                on_log(record)
    finally:
        model.train(was_training)
    composition.assert_frozen()
    return history
