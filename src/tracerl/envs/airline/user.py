"""The scripted user: deterministic, template-based, answers from its scenario.

It opens with its request(s), answers the agent's questions, says "yes" to a confirmation
request, ends the conversation when the agent closes or refuses its only request, and otherwise
restates what it wants. Keyword rules on the agent's text (lower-cased), first match wins:

    closing ("anything else", "goodbye", "all done")  -> "No, thank you. Goodbye."          (ends)
    refusal ("cannot"), one request only               -> "I understand. Goodbye."           (ends)
    refusal ("cannot"), several requests               -> "OK, I understand."
    confirmation ("confirm", "proceed")                -> "yes"
    "user id"                                          -> "My user id is <id>."
    "reservation id", "which reservation"              -> "The reservation id is <id>." / "… ids are <ids>."
    "reason"  (when a cancellation was asked)          -> "The reason is <reason>."
    "payment", "pay with" (when a payment is involved) -> "Please use my <credit card | gift card>."
    anything else                                      -> "I want to <request>." / "I want to: <requests>."
"""

from __future__ import annotations

from tracerl.envs.airline.tasks import AirlineTask

CLOSING_WORDS = ("anything else", "goodbye", "all done")
REFUSAL_WORDS = ("cannot",)
CONFIRM_WORDS = ("confirm", "proceed")
GOODBYE = "No, thank you. Goodbye."


class ScriptedUser:
    def __init__(self, task: AirlineTask):
        self.task = task

    def opening(self) -> str:
        return self.task.opening

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """(the user's answer, whether the user ends the conversation)."""
        text = agent_text.lower()
        subs = self.task.subtasks
        if any(w in text for w in CLOSING_WORDS):
            return GOODBYE, True
        if any(w in text for w in REFUSAL_WORDS):
            return ("I understand. Goodbye.", True) if len(subs) == 1 else ("OK, I understand.", False)
        if any(w in text for w in CONFIRM_WORDS):
            return "yes", False
        if "user id" in text:
            return f"My user id is {self.task.user_id}.", False
        if "reservation id" in text or "which reservation" in text:
            ids = [s.reservation_id for s in subs]
            return (f"The reservation id is {ids[0]}." if len(ids) == 1 else f"The reservation ids are {', '.join(ids)}."), False
        reasons = [f"{s.reason} for {s.reservation_id}" if len(subs) > 1 else s.reason for s in subs if s.reason]
        if "reason" in text and reasons:
            return f"The reason is {' and '.join(reasons)}.", False
        payments = sorted({s.payment for s in subs if s.payment})
        if ("payment" in text or "pay with" in text) and payments:
            return f"Please use my {' and '.join(payments)}.", False
        requests = [s.request for s in subs]
        if len(requests) == 1:
            return f"I want to {requests[0]}.", False
        return "I want to: " + "; ".join(requests) + ".", False
