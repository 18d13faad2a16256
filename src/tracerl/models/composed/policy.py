"""Sampling from a composed model with the local backend.

moe routed per token needs nothing special — the `ComposedModel` that `load_composed` returns is an
HF causal LM that routes every call, so `LocalPolicy(model, tokenizer)` (or a `routes={"name": model}`
entry) samples from it, each token routing itself. Router / merge modes, and moe routed at the
opening, route per episode: `ComposedPolicy` routes each session once, on its opening, keeps the
weights in the session's state, and hands every forward call the weights of the rows still running
(`routing_weights=`), so one batch mixes tasks routed to different adapters.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tracerl.core.errors import InputError
from tracerl.core.policy import Session
from tracerl.models.composed.artifact import load_composed
from tracerl.models.composed.composition import composition_of
from tracerl.models.generation import GenerationRequest, generate
from tracerl.models.local import LocalPolicy

WEIGHTS_KEY = "routing_weights"


class ComposedPolicy(LocalPolicy):
    """A LocalPolicy whose model is a composed model (any mode; the composed model or its base with the
    composition installed). Sessions' `adapter` must be None or the policy's name; the composition
    decides the adapters. The continuous engine samples it too: each session's routing weights ride
    in its requests' `extra`, one row of `routing_weights` per running row."""

    samples_continuously: ClassVar[bool] = True  # its act / _request / generate_requests: see `LocalPolicy.turns`

    def __init__(self, model: Any, tokenizer: Any = None, **kwargs: Any):
        composition = composition_of(model)
        model = composition.composed_model
        super().__init__(model, tokenizer if tokenizer is not None else model.tracerl_tokenizer, **kwargs)
        self.composition = composition
        self._pending: dict[int, Any] = {}  # id(session) -> its routing weights, from `act`

    @property
    def adapters(self) -> list[str]:
        """No adapters to pick by name: the composition routes (the model itself is served by name)."""
        return []

    def load_adapter(self, name: str, path: Any) -> None:
        raise InputError("a composed model's adapters are fixed: compose again with `tracerl compose`")

    def unload_adapter(self, name: str) -> None:
        raise InputError("a composed model's adapters are fixed: compose again with `tracerl compose`")

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter not in (None, self.name):
            super()._check_adapter(adapter)

    def act(self, sessions: list[Session]) -> list:
        if self.composition.routes_by_weights:
            fresh = [s for s in sessions if s.state is None or WEIGHTS_KEY not in getattr(s.state, "extra", {})]
            if fresh:
                weights = self.composition.weights_for([s.messages for s in fresh], [s.tools for s in fresh])
                self._pending = {id(s): w for s, w in zip(fresh, weights, strict=True)}
        return super().act(sessions)

    def _request(self, session: Session, ids: list[int], budget: int) -> GenerationRequest:
        request = super()._request(session, ids, budget)
        request.extra = None
        if self.composition.routes_by_weights:
            extra = session.state.extra
            if WEIGHTS_KEY not in extra:
                pending = self._pending.pop(id(session), None)
                if pending is None:  # a turn of the continuous engine: no `act` routed its batch
                    pending = self.composition.weights_for([session.messages], [session.tools])[0]
                extra[WEIGHTS_KEY] = tuple(float(x) for x in pending)
                session.info["routing"] = dict(zip(self.composition.slot_names, (round(x, 4) for x in extra[WEIGHTS_KEY])))
            request.extra = extra[WEIGHTS_KEY]
        return request

    def continuous_forward_kwargs(self, route: str | None):
        return self.composition.forward_kwargs

    def generate_requests(self, requests: list[GenerationRequest]) -> list:
        """Generate through the composed model. Requests of a composition routed per episode without
        weights in `extra` (e.g. from the OpenAI server, whose `extra` names the model) are routed
        here from their prompt ids first, so a shared-prefix prefill never has to route a partial prompt."""
        if self.composition.routes_by_weights:
            unrouted = [r for r in requests if not isinstance(r.extra, tuple)]
            if unrouted:
                weights = self.composition.weights_for_prompt_ids([r.prompt_ids for r in unrouted])
                for r, w in zip(unrouted, weights, strict=True):
                    r.extra = tuple(float(x) for x in w)
        else:
            for r in requests:
                r.extra = None
        results: list = []
        for start in range(0, len(requests), self.max_batch_size):
            chunk = requests[start : start + self.max_batch_size]
            results += generate(self.model, chunk, pad_id=self.pad_id, logprobs_mode=self.logprobs_mode,
                                forward_kwargs=self.composition.forward_kwargs)
        return results


def composed_server_policy(path: str, device: str | None, logprobs_mode: str, served_model_name: str | None,
                           adapters: list, dtype: str | None = None) -> tuple[ComposedPolicy, str]:
    """`tracerl serve --model COMPOSED_DIR`: the policy for the server, and the name it is served under
    (composition.json's `model_name` unless --served-model-name is given)."""

    if adapters:
        raise InputError("--lora cannot be combined with a composed model (its adapters are fixed)")
    model = load_composed(path, device=device, dtype=dtype)
    name = served_model_name or model.tracerl_composition.name
    return ComposedPolicy(model, logprobs_mode=logprobs_mode, name=name), name
