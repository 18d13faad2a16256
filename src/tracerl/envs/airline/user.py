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
    the request's own questions, in order; the airline's:
      "reservation id", "which reservation"            -> "The reservation id is <id>."
      "reason"  (a cancellation)                       -> "The reason is <reason>."
      "payment", "pay with" (a change or bags)         -> "Please use <payment id>."
      "which date", "what date" (a change)            -> "On <date>." (the date of the flight it asks for)
    anything else                                      -> the request at hand, restated

The capability templates' users are this user with their own requests; a target user's request a
template asks answers the airline's questions about the values it says (`request_questions`).
"""

from __future__ import annotations

from tracerl.envs.airline.tasks import AirlineTask, opening_text, request_text

CLOSING_WORDS = ("anything else", "goodbye", "all done")
NEXT_WORDS = ("next request",)
REFUSAL_WORDS = ("cannot",)
CONFIRM_WORDS = ("confirm", "proceed")
GOODBYE = "No, thank you. Goodbye."
ALL_GIVEN = "That is all. Goodbye."

Question = tuple[tuple[str, ...], str]  # (keywords in the agent's text, the user's answer)


def request_questions(reservation_id: str | None, reason: str | None = None, payment: str | None = None,
                      date: str | None = None) -> list[Question]:
    """The airline user's answers about one request: its reservation, reason, payment and date."""
    asked: list[Question] = []
    if reservation_id:
        asked.append((("reservation id", "which reservation"), f"The reservation id is {reservation_id}."))
    if reason:
        asked.append((("reason",), f"The reason is {reason}."))
    if payment:
        asked.append((("payment", "pay with"), f"Please use {payment}."))
    if date:
        asked.append((("which date", "what date"), f"On {date}."))
    return asked


class ScriptedUser:
    """`requests` in the user's words; `questions[i]`: what the user answers about request i."""

    def __init__(self, requests: list[str], user_id: str | None, questions: list[list[Question]] | None = None):
        self.requests = requests
        self.user_id = user_id
        self.questions = questions or [[] for _ in requests]
        self.current = 0  # the request at hand: the opening states request 0

    @classmethod
    def for_airline(cls, task: AirlineTask) -> ScriptedUser:
        questions = []
        for sub in task.subtasks:
            dates = [a.arguments["date"] for a in sub.reads + sub.anyway_reads if a.name == "search_direct_flight"]
            questions.append(request_questions(sub.reservation_id, sub.reason, sub.payment, dates[0] if dates else None))
        return cls([s.request for s in task.subtasks], task.user_id, questions)

    def opening(self) -> str:
        return opening_text(self.requests)

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """(the user's answer, whether the user ends the conversation)."""
        text = agent_text.lower()
        last = self.current == len(self.requests) - 1
        if any(w in text for w in CLOSING_WORDS):
            return GOODBYE, True
        if any(w in text for w in NEXT_WORDS):
            if last:
                return ALL_GIVEN, True
            self.current += 1
            return request_text(self.requests, self.current), False
        if any(w in text for w in REFUSAL_WORDS):
            return ("I understand. Goodbye.", True) if last else ("OK, I understand.", False)
        if any(w in text for w in CONFIRM_WORDS):
            return "yes", False
        if "user id" in text and self.user_id is not None:
            return f"My user id is {self.user_id}.", False
        for keywords, answer in self.questions[self.current]:
            if any(k in text for k in keywords):
                return answer, False
        return request_text(self.requests, self.current), False
