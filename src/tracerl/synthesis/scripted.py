"""A scripted policy for calibration checks: follows the task's gold calls, each right with
probability `accuracy`, and gives up at the first one it gets wrong.

On a task of L gold calls it succeeds with probability accuracy^L, so its success falls as the
difficulty knob adds steps — a known, seeded base policy to test calibration with. A wrong call is
the gold call with its last argument value replaced (or, without arguments, left out entirely).
"""

from __future__ import annotations

import random

from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.policy import Session

CLOSING = "All your requests are handled. Is there anything else?"


class NoisyOraclePolicy:
    def __init__(self, accuracy: float = 0.8, seed: int = 0):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
        self.accuracy = accuracy
        self.seed = seed
        self.name = f"scripted:{accuracy:g}"
        self._sessions = 0

    def act(self, sessions: list[Session]) -> list[Message]:
        return [self._act(s) for s in sessions]

    def _act(self, session: Session) -> Message:
        if session.state is None:
            self._sessions += 1
            session.state = {"step": 0, "rng": random.Random(f"{self.seed}|{self._sessions}"), "stopped": False}
        state = session.state
        gold = [Action.model_validate(a) for a in session.info.get("gold_actions", [])]
        if state["stopped"] or state["step"] >= len(gold):
            return Message.assistant(CLOSING)
        action = gold[state["step"]]
        state["step"] += 1
        if state["rng"].random() >= self.accuracy:
            state["stopped"] = True
            if not action.arguments:
                return Message.assistant(CLOSING)
            arguments = dict(action.arguments)
            last = sorted(arguments)[-1]
            arguments[last] = f"{arguments[last]}x"
            action = Action(name=action.name, arguments=arguments)
        call = ToolCall.make(action.name, action.arguments, f"call_{state['step']}")
        return Message.assistant(tool_calls=[call])
