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
    the request's own questions, in order (`request_questions`):
      "<entity> id", "which <entity>"                  -> "The <entity> id is <id>."
      "reason"                                         -> "The reason is <reason>."
      "payment", "pay with"                            -> "Please use <payment id>."
      "which date", "what date"                        -> "On <date>."
    anything else                                      -> the request at hand, restated

The built-in airline domain plays this user with its tasks' requests; the capability templates
play it with theirs, asking about records of the target's entity (a reservation, an order, …).
"""

from __future__ import annotations

CLOSING_WORDS = ("anything else", "goodbye", "all done")
NEXT_WORDS = ("next request",)
REFUSAL_WORDS = ("cannot",)
CONFIRM_WORDS = ("confirm", "proceed")
GOODBYE = "No, thank you. Goodbye."
ALL_GIVEN = "That is all. Goodbye."
ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth", "Sixth")  # the templates ask up to 6

Question = tuple[tuple[str, ...], str]  # (keywords in the agent's text, the user's answer)


def opening_text(requests: list[str]) -> str:
    """The user's first message: "Hi! I want to …." or "Hi! I have 3 requests. First, I want to …."."""
    return f"Hi! {request_text(requests, 0)}" if len(requests) == 1 else \
        f"Hi! I have {len(requests)} requests. {request_text(requests, 0)}"


def request_text(requests: list[str], index: int) -> str:
    """How the user states request `index` of several ("Second, I want to …."); one alone: "I want to …."."""
    if len(requests) == 1:
        return f"I want to {requests[0]}."
    return f"{ORDINALS[index]}, I want to {requests[index]}."


def request_questions(record_id: str | None, *, entity: str = "reservation", reason: str | None = None,
                      payment: str | None = None, date: str | None = None) -> list[Question]:
    """The user's answers about one request: the id of its record (a record of `entity`), its reason,
    payment and date."""
    asked: list[Question] = []
    if record_id:
        asked.append(((f"{entity} id", f"which {entity}"), f"The {entity} id is {record_id}."))
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
