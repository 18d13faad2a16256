"""Task-level routing (TRACE's Select & Adapt): the base model as a zero-shot classifier.

The router shows the base model the capability descriptions, each under a one-token label
(A, B, C, … and a last label for "the general assistant", i.e. no adapter), then the first user
turn of the task, and reads the next-token probabilities of the label tokens at the start of the
answer. Renormalised over the labels they are the weights α (batch, N+1), slot 0 = base:

    α_s = p(label_s | prompt) / Σ_t p(label_t | prompt) = softmax(logits[label ids])_s

`top1_weights` / `top_p_weights` (in `composed`) turn α into routing weights; `route_names`
turns α into one adapter name per request for servers that hold one LoRA per request (vLLM).

The label logits are `h · E_labelᵀ`, h the final (normed) hidden state at the answer position
and E_label the output-embedding rows of the label tokens. A small base model is no zero-shot
classifier (the embedded 0.6M-parameter agent answers the same label for every request), so
`fit` can calibrate the label head on labelled requests: E_label (N+1 × H) and a bias start
from the zero-shot values — at step 0 the router *is* the zero-shot router — and train with
cross-entropy on the first user turns of the capability environments' rollouts. Only those
(N+1)(H+1) numbers change; the base model stays frozen.
"""

from __future__ import annotations

from typing import Any

import torch

from tracerl.core.errors import InputError
from tracerl.models.chat import first_user_turn

ROUTER_SYSTEM = (
    "You are a dispatcher. Read the customer's request and decide which specialist should handle it. "
    "Answer with the specialist's letter only."
)
BASE_DESCRIPTION = "the general assistant: the request needs none of the specialists above"
DEFAULT_LABELS = [chr(ord("A") + i) for i in range(26)]


def request_of(conversation: list[Any]) -> str:
    """What the router reads of a conversation: its first user turn (`tracerl.models.chat.first_user_turn`)."""
    request = first_user_turn(conversation)
    if request is None:
        raise InputError("a conversation to route has no user turn")
    return request


class TaskRouter:
    """Zero-shot classifier over capabilities with the base `model` (a composed model computes the base
    outside routed calls, so its own `model` serves)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        capabilities: list[Any],
        *,
        labels: list[str] | None = None,
        base_description: str = BASE_DESCRIPTION,
        template_kwargs: dict[str, Any] | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.capabilities = capabilities
        self.base_description = base_description
        self.template_kwargs = dict(template_kwargs or {})
        count = len(capabilities) + 1
        labels = list(labels or DEFAULT_LABELS[:count])
        if len(labels) != count:
            raise InputError(f"the router needs {count} labels (one per capability plus base), got {len(labels)}")
        self.labels = labels  # labels[i] for capability i (slot i+1); labels[-1] for base (slot 0)
        ids = []
        for label in labels:
            encoded = list(tokenizer.encode(label, add_special_tokens=False))
            if len(encoded) != 1 or encoded[0] == getattr(tokenizer, "unk_token_id", None):
                raise InputError(f"router label {label!r} is not one token of the tokenizer; choose other labels")
            ids.append(encoded[0])
        if len(set(ids)) != len(ids):
            raise InputError(f"router labels {labels} do not map to distinct tokens")
        self.label_ids_by_slot = [ids[-1]] + ids[:-1]
        self.head_weight: torch.Tensor | None = None  # (N+1, H) in slot order, once `fit`
        self.head_bias: torch.Tensor | None = None

    def set_head(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """Classify with a fitted label head (N+1, H) and bias (N+1,) in slot order (`fit` makes one)."""
        device = next(self.model.parameters()).device
        self.head_weight, self.head_bias = weight.to(device), bias.to(device)

    @property
    def kind(self) -> str:
        return "zero-shot" if self.head_weight is None else "label-head"

    def head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (N+1, H), bias (N+1,)) of the label logits: the label tokens' output embeddings, or the fitted head."""
        if self.head_weight is not None and self.head_bias is not None:
            return self.head_weight, self.head_bias
        output = self.model.get_output_embeddings()
        weight = output.weight[self.label_ids_by_slot].detach().float()
        bias = output.bias[self.label_ids_by_slot].detach().float() if getattr(output, "bias", None) is not None else torch.zeros(len(weight))
        return weight, bias.to(weight.device)

    def messages(self, request: str) -> list[dict[str, str]]:
        """The classification conversation for one request (the answer follows the generation prompt)."""
        options = [f"{label}: {c.name} — {c.description}".rstrip(" —") for label, c in zip(self.labels, self.capabilities)]
        options.append(f"{self.labels[-1]}: {self.base_description}")
        user = "Specialists:\n" + "\n".join(options) + f"\n\nRequest:\n{request}\n\nWhich specialist? Answer with one letter."
        return [{"role": "system", "content": ROUTER_SYSTEM}, {"role": "user", "content": user}]

    def prompt_ids(self, request: str) -> list[int]:
        messages = self.messages(request)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs)
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n\nAnswer: "
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @torch.no_grad()
    def answer_states(self, requests: list[str], batch_size: int = 16) -> torch.Tensor:
        """The final normed hidden state at the answer position of each request's prompt, (batch, H)."""
        device = next(self.model.parameters()).device
        states = []
        for start in range(0, len(requests), batch_size):
            prompts = [self.prompt_ids(r) for r in requests[start : start + batch_size]]
            width = max(len(p) for p in prompts)
            ids = torch.zeros((len(prompts), width), dtype=torch.long)
            attention = torch.zeros_like(ids)
            for row, p in enumerate(prompts):  # right padding: the causal prefix up to each prompt's end is unaffected
                ids[row, : len(p)] = torch.tensor(p)
                attention[row, : len(p)] = 1
            hidden = self.model.model(input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False).last_hidden_state
            last = torch.tensor([len(p) - 1 for p in prompts], device=device)
            states.append(hidden[torch.arange(len(prompts), device=device), last].float())
        return torch.cat(states)

    def label_logits(self, requests: list[str]) -> torch.Tensor:
        """Next-token logits of the label tokens after each request's prompt, (batch, N+1) in slot order."""
        weight, bias = self.head()
        states = self.answer_states(requests)
        return states @ weight.to(states.device).T + bias.to(states.device)

    def fit(self, requests: list[str], slots: list[int], *, steps: int = 300, learning_rate: float = 1e-2) -> dict:
        """Calibrate the label head on labelled requests (full-batch Adam from the zero-shot head); returns a summary."""
        if not requests or len(requests) != len(slots):
            raise InputError("the router needs labelled requests to fit its label head")
        if steps < 1:
            raise InputError(f"router fit steps must be ≥ 1, got {steps}")
        states = self.answer_states(requests)
        targets = torch.tensor(slots, device=states.device)
        weight0, bias0 = self.head()
        weight = weight0.clone().to(states.device).requires_grad_(True)
        bias = bias0.clone().to(states.device).requires_grad_(True)
        optimizer = torch.optim.Adam([weight, bias], lr=learning_rate)
        before = float((states @ weight0.to(states.device).T + bias0.to(states.device)).argmax(-1).eq(targets).float().mean())
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(states @ weight.T + bias, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        self.head_weight, self.head_bias = weight.detach(), bias.detach()
        after = float((states @ weight.detach().T + bias.detach()).argmax(-1).eq(targets).float().mean())
        return {"requests": len(requests), "steps": steps, "learning_rate": learning_rate, "loss": loss.item(),
                "train_accuracy_zero_shot": before, "train_accuracy": after}

    def alphas(self, conversations: list[list[Any]]) -> torch.Tensor:
        """α (batch, N+1): the label probabilities renormalised over the labels; slot 0 = base."""
        return self.label_logits([request_of(c) for c in conversations]).softmax(dim=-1)


def route_names(alpha: torch.Tensor, slot_names: list[str]) -> list[str | None]:
    """The top-1 adapter name per row for one-LoRA-per-request servers (None = the base model)."""
    return [None if int(s) == 0 else slot_names[int(s)] for s in alpha.argmax(dim=-1)]
