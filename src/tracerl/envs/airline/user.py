"""The airline's user: the generic scripted user (`tracerl.envs.scripted_user`) with a task's
requests, answering the airline's questions about each: its reservation, its reason (a
cancellation), its payment (a change or bags) and its date (a change: the date of the flight it
asks for)."""

from __future__ import annotations

from tracerl.envs.airline.tasks import AirlineTask
from tracerl.envs.scripted_user import ScriptedUser, request_questions


def airline_user(task: AirlineTask) -> ScriptedUser:
    questions = []
    for sub in task.subtasks:
        dates = [a.arguments["date"] for a in sub.reads + sub.anyway_reads if a.name == "search_direct_flight"]
        questions.append(request_questions(sub.reservation_id, reason=sub.reason, payment=sub.payment,
                                           date=dates[0] if dates else None))
    return ScriptedUser([s.request for s in task.subtasks], task.user_id, questions)
