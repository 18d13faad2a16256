"""The scripted user: deterministic, template-based, answers from its scenario.

It opens with its request(s), gives its user id when asked, says "yes" to a confirmation request,
ends the conversation when the agent closes ("anything else", "goodbye") or refuses its only
request, and otherwise restates what it wants. Keyword rules, checked in this order:

    closing ("anything else", "goodbye")        -> "No, thank you. Goodbye."              (ends)
    refusal ("cannot"), one request only        -> "I understand. Goodbye."               (ends)
    refusal ("cannot"), several requests        -> "OK, I understand."
    confirmation ("confirm", "proceed")         -> "yes"
    user id ("user id")                         -> "My user id is <id>."
    anything else                               -> "I want to <request>." / "I want to: <requests>."
"""

from __future__ import annotations

from tracerl.envs.airline.tasks import AirlineTask

CLOSING_WORDS = ("anything else", "goodbye")
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
        if any(w in text for w in CLOSING_WORDS):
            return GOODBYE, True
        if any(w in text for w in REFUSAL_WORDS):
            if len(self.task.subtasks) == 1:
                return "I understand. Goodbye.", True
            return "OK, I understand.", False
        if any(w in text for w in CONFIRM_WORDS):
            return "yes", False
        if "user id" in text:
            return f"My user id is {self.task.user_id}.", False
        requests = [s.request for s in self.task.subtasks]
        if len(requests) == 1:
            return f"I want to {requests[0]}.", False
        return "I want to: " + "; ".join(requests) + ".", False
