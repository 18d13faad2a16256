"""The agent policy of the airline domain: the text the agent is prompted with and the same rules as code.

The text is deliberately short and regular (a tiny model is prompted with it). Each rule below is
stated once in `POLICY` and once as a function; the task generator, the reference policies and
the tests use the functions, so the text and the code cannot drift apart silently.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tracerl.envs.airline.data_model import AirlineDB, Reservation, User
from tracerl.envs.prompts import NEXT_REQUEST_RULE, rule_hint

NOW = "2024-05-15 15:00"
BAG_FEE = 50
CERTIFICATE_PER_PASSENGER = 100
COVERED_REASONS = ("health", "weather")

POLICY = f"""You are an airline agent. The current time is {NOW}.
Ask the user for their user id, get the user details, and get each reservation before you act on it.
Before each write, state the action and the amount, and ask the user to confirm. Make one tool call at a time.
Deny any request the rules below forbid, and say why.
Cancel: not allowed if a flight was already flown. Otherwise allowed only if one holds: the booking was made in the last 24 hours; the airline cancelled a flight; the cabin is business; the insurance is yes and the reason is health or weather. The refund is the sum of the payment history.
Change flight: not allowed for basic_economy. Keep origin, destination and cabin. Pick the cheapest direct flight that meets the user's needs and list every flight of the reservation. Tell the user the new flight's price per passenger.
Bags: free bags per passenger are basic_economy 0, economy 1, business 2, plus 1 for silver and 2 for gold members. Each extra bag costs {BAG_FEE}.
Compensation: only when asked, only for a cancelled flight, and only if the user is silver or gold, has insurance, or flies business. Send a certificate of {CERTIFICATE_PER_PASSENGER} x passengers.
Tell the user every amount. {NEXT_REQUEST_RULE}"""

HINT = rule_hint("reservation", "get_reservation_details")  # what an airline episode may carry (option `hint`)


_FREE_BAGS = {"basic_economy": 0, "economy": 1, "business": 2}
_MEMBER_BONUS = {"regular": 0, "silver": 1, "gold": 2}


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M")


def booked_within_24h(created_at: str, now: str = NOW) -> bool:
    return timedelta(0) <= _time(now) - _time(created_at) <= timedelta(hours=24)


def flight_statuses(db: AirlineDB, reservation: Reservation) -> list[str]:
    statuses = []
    for segment in reservation.flights:
        flight = db.flight(segment.flight_number, segment.date)
        statuses.append(flight.status if flight else "available")
    return statuses


def cancel_rule(db: AirlineDB, reservation: Reservation, reason: str) -> tuple[bool, str]:
    """(allowed, why) for cancelling `reservation` for `reason`."""
    statuses = flight_statuses(db, reservation)
    if "landed" in statuses:
        return False, "a flight was already flown"
    if booked_within_24h(reservation.created_at):
        return True, "booked in the last 24 hours"
    if "cancelled" in statuses:
        return True, "the airline cancelled a flight"
    if reservation.cabin == "business":
        return True, "the cabin is business"
    if reservation.insurance == "yes" and reason in COVERED_REASONS:
        return True, f"the insurance covers {reason}"
    return False, "no cancellation rule applies"


def cancel_check(db: AirlineDB, reservation: Reservation, reason: str, cite: bool = False) -> str:
    """The rule check said before deciding a cancellation: `cancel_rule`'s conditions in its order,
    each answered, up to the one that decides ("Check: flown no, booked in the last 24 hours yes.").
    With `cite` each answer follows the values it is read from, as the conversation shows them
    ("Check: flown (available, available) no, booked in the last 24 hours (2024-05-15 09:00) yes.")."""
    statuses = flight_statuses(db, reservation)
    shown = ", ".join(statuses)
    return _check([("flown", shown, "landed" in statuses, True),
                   ("booked in the last 24 hours", reservation.created_at, booked_within_24h(reservation.created_at), True),
                   ("cancelled by the airline", shown, "cancelled" in statuses, True),
                   ("business", reservation.cabin, reservation.cabin == "business", True),
                   ("insured for the reason", f"{reservation.insurance}, {reason.replace('_', ' ')}",
                    reservation.insurance == "yes" and reason in COVERED_REASONS, True)], cite)


def compensation_check(db: AirlineDB, user: User, reservation: Reservation, cite: bool = False) -> str:
    """The rule check said before deciding a compensation, as `cancel_check` ("Check: a flight
    cancelled yes, silver or gold no, insured yes.")."""
    statuses = flight_statuses(db, reservation)
    return _check([("a flight cancelled", ", ".join(statuses), "cancelled" in statuses, False),
                   ("silver or gold", user.membership, user.membership in ("silver", "gold"), True),
                   ("insured", reservation.insurance, reservation.insurance == "yes", True),
                   ("business", reservation.cabin, reservation.cabin == "business", True)], cite)


def _check(conditions: list[tuple[str, str, bool, bool]], cite: bool) -> str:
    """'Check: a yes, b no.' (with `cite`: 'Check: a (value) yes, b (value) no.') — (label, value,
    holds, decides_when): answered in order up to the first condition whose answer decides
    (`holds == decides_when`)."""
    said = []
    for label, value, holds, decides_when in conditions:
        said.append(f"{label} {f'({value}) ' if cite else ''}{'yes' if holds else 'no'}")
        if holds == decides_when:
            break
    return "Check: " + ", ".join(said) + "."


def change_rule(reservation: Reservation) -> tuple[bool, str]:
    if reservation.cabin == "basic_economy":
        return False, "basic_economy cannot be changed"
    return True, "the cabin can be changed"


def free_bags(membership: str, cabin: str, passengers: int) -> int:
    return (_FREE_BAGS[cabin] + _MEMBER_BONUS[membership]) * passengers


def compensation_rule(db: AirlineDB, user: User, reservation: Reservation) -> tuple[bool, str]:
    if "cancelled" not in flight_statuses(db, reservation):
        return False, "no flight was cancelled"
    if user.membership in ("silver", "gold"):
        return True, f"the user is {user.membership}"
    if reservation.insurance == "yes":
        return True, "the reservation has insurance"
    if reservation.cabin == "business":
        return True, "the cabin is business"
    return False, "the user is regular, has no insurance and does not fly business"
