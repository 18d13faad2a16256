"""The scripted user: deterministic, template-based, answers from its scenario.

It opens with its first request and gives the others one at a time, each when the agent asks for
the next request; it answers the agent's questions about the request at hand, says "yes" to a
confirmation request, and ends the conversation when the agent closes, when it asks for a next
request after the last, or when it refuses the last request. Keyword rules on the agent's text
(lower-cased), first match wins:

    closing ("anything else", "goodbye", "all done")  -> "No, thank you. Goodbye."          (ends)
    "next request", another request left               -> "Second, I want to <request>."
    "next request", none left                          -> "That is all. Goodbye."            (ends)
    refusal ("cannot"), of the last request            -> "I understand. Goodbye."           (ends)
    refusal ("cannot"), another request left           -> "OK, I understand."
    confirmation ("confirm", "proceed")                -> "yes"
    "user id"                                          -> "My user id is <id>."
    "reservation id", "which reservation"              -> "The reservation id is <id>."
    "reason"  (a cancellation)                         -> "The reason is <reason>."
    "payment", "pay with" (a change or bags)           -> "Please use <payment id>."
    anything else                                      -> the request at hand, restated
"""

from __future__ import annotations

from tracerl.envs.airline.tasks import AirlineTask, request_text

CLOSING_WORDS = ("anything else", "goodbye", "all done")
NEXT_WORDS = ("next request",)
REFUSAL_WORDS = ("cannot",)
CONFIRM_WORDS = ("confirm", "proceed")
GOODBYE = "No, thank you. Goodbye."
ALL_GIVEN = "That is all. Goodbye."


class ScriptedUser:
    def __init__(self, task: AirlineTask):
        self.task = task
        self.current = 0  # the request at hand: the opening states request 0

    def opening(self) -> str:
        return self.task.opening

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """(the user's answer, whether the user ends the conversation)."""
        text = agent_text.lower()
        subs = self.task.subtasks
        last = self.current == len(subs) - 1
        if any(w in text for w in CLOSING_WORDS):
            return GOODBYE, True
        if any(w in text for w in NEXT_WORDS):
            if last:
                return ALL_GIVEN, True
            self.current += 1
            return request_text(subs, self.current), False
        if any(w in text for w in REFUSAL_WORDS):
            return ("I understand. Goodbye.", True) if last else ("OK, I understand.", False)
        if any(w in text for w in CONFIRM_WORDS):
            return "yes", False
        sub = subs[self.current]
        if "user id" in text:
            return f"My user id is {self.task.user_id}.", False
        if "reservation id" in text or "which reservation" in text:
            return f"The reservation id is {sub.reservation_id}.", False
        if "reason" in text and sub.reason:
            return f"The reason is {sub.reason}.", False
        if ("payment" in text or "pay with" in text) and sub.payment:
            return f"Please use {sub.payment}.", False
        return request_text(subs, self.current), False
