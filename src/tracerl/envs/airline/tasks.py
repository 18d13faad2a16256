"""Airline tasks generated from a seed: a small database, the user's requests, gold actions.

`generate_task(seed)` is a pure function of the seed. A task has 1–4 sub-tasks, each on its own
reservation of one user:

- `cancel`       precondition: allowed or forbidden by booking time / airline cancellation /
                 cabin / insurance and reason / flown segments — only reading the reservation tells;
- `change`       structured reasoning + precondition: the cheapest direct flight meeting the
                 user's constraint, in the same cabin, all segments listed; basic_economy is forbidden;
- `bags`         structured reasoning: total and non-free bags from the membership/cabin allowance;
- `certificate`  precondition + reasoning: eligible only for a cancelled flight and a silver/gold
                 member, an insured or a business reservation; 100 × passengers.

Two or more sub-tasks make a `multi` task (multi-step completion): the user opens with the first
request and gives each next one when the agent asks for it, so the ids a request's calls need are in
the user's latest message. Tool precision runs through
all of them (exact ids, argument names and types). Each sub-task also carries what the reference
policies need: the reads to make, the confirmation or refusal text, and the faulty variants
planted by the `flawed` policy (a mis-picked value; the write it would make if it ignored the rule).

A confirmation restates what the agent decided or computed (a new flight, a bag count and its fee,
a certificate's amount), never an amount it would only copy out of a record: a cancellation's
refund and a new flight's price are not required to be said. The embedded agent copies ids and
computes these values, but no build has learnt to say a number found by its key in a tool result
(at most 1 of 46 held-out refunds, even on drills that write the record's key before it, 2026-12-03 at
d2343e5; docs/embedded-agent.md, "What it cannot do"), and no capability template teaches that copy, so
it would cap every variant alike instead of showing where TRACE helps.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.messages import Action
from tracerl.envs.airline.data_model import (
    AirlineDB,
    Flight,
    Passenger,
    Payment,
    PaymentMethod,
    Reservation,
    ReservedFlight,
    User,
)
from tracerl.envs.airline.policy import (
    BAG_FEE,
    CERTIFICATE_PER_PASSENGER,
    NOW,
    cancel_check,
    cancel_rule,
    change_rule,
    compensation_check,
    compensation_rule,
    free_bags,
)
from tracerl.envs.scripted_user import opening_text

TRAIN_SEEDS = range(0, 100_000)
TEST_SEEDS = range(1_000_000, 1_100_000)
SPLITS: dict[str, range] = {"train": TRAIN_SEEDS, "test": TEST_SEEDS}

SubTaskKind = Literal["cancel", "change", "bags", "certificate"]
_SINGLE_KINDS = (("cancel", 0.25), ("change", 0.20), ("bags", 0.15), ("certificate", 0.10), ("multi", 0.30))
_MULTI_SIZES = ((2, 0.55), (3, 0.35), (4, 0.10))
_MULTI_KINDS = (("cancel", 0.35), ("change", 0.25), ("bags", 0.25), ("certificate", 0.15))
# how often a request is allowed by the rules (bags always are); single requests are forbidden more often
_ALLOWED_RATES = {"single": {"cancel": 0.5, "change": 0.75, "certificate": 0.5},
                  "multi": {"cancel": 0.75, "change": 0.8, "certificate": 0.75}}

AIRPORTS = ("ATL", "BOS", "DEN", "DFW", "JFK", "LAS", "LAX", "MIA", "ORD", "PHX", "SEA", "SFO")
FIRST_NAMES = ("mia", "noah", "ava", "liam", "emma", "omar", "lucas", "sofia", "yara", "ivan", "chen", "amir",
               "lena", "raj", "nina", "ethan", "aisha", "mateo", "sara", "juan")
LAST_NAMES = ("lee", "kim", "garcia", "smith", "patel", "rossi", "khan", "silva", "moore", "nguyen", "lopez",
              "brown", "ali", "wang", "davis", "muller", "jones", "costa", "sato", "ahmed")
REASONS = {"change_of_plan": "a change of plan", "health": "my health", "weather": "the weather",
           "airline_cancelled": "a flight the airline cancelled"}
# A reservation id is one code word ('wren'), a single token, not τ²-bench's random 6-character
# codes ('8JX2WO'). A code of letters and digits is a run of characters that recur all over the
# episode, and a 0.9M-parameter agent never learnt to copy it; of a two-word id ('wren_amber') it
# learnt the first word's lookup or the second word's, not both, from one drill mix to the next
# (measured 2026-12-01 to 2026-12-03; docs/embedded-agent.md, "What it is").
CODE_WORDS = ("alder", "aspen", "birch", "cedar", "elm", "fir", "hazel", "larch", "maple", "oak", "pine",
              "rowan", "willow", "yew", "crane", "dove", "egret", "finch", "heron", "ibis", "kite", "lark",
              "otter", "owl", "robin", "swan", "tern", "wren", "amber", "coral", "jade", "onyx", "opal",
              "pearl", "ruby", "topaz", "comet", "ember", "frost", "meadow", "orbit", "pebble", "prism",
              "quartz", "river", "summit", "tundra", "valley")
_CODE_WORD = "(?:" + "|".join(CODE_WORDS) + ")"
RESERVATION_ID = re.compile(rf"\b{_CODE_WORD}\b")
# User and payment ids end in a word of their own pool ('mia_lee_plum', 'gift_card_harp'), for the
# same reason: a run of digits is copied far less reliably than a word (docs/embedded-agent.md,
# "What it is").
ID_WORDS = ("anchor", "basket", "bucket", "button", "candle", "carpet", "castle", "cotton", "drum", "feather",
            "fiddle", "hammer", "harp", "helmet", "island", "jacket", "kettle", "ladder", "ladle", "lantern",
            "lemon", "magnet", "marble", "mirror", "mitten", "needle", "olive", "paddle", "parcel", "pepper",
            "pillow", "plum", "pocket", "puzzle", "rocket", "saddle", "sandal", "shovel", "spoon", "teapot",
            "tunnel", "velvet", "violin", "wagon", "whistle", "zipper")


def task_seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """The first `n` task seeds of a split (after `offset`): a fixed, reproducible task set."""
    seeds = SPLITS[split]
    if offset < 0 or n < 0 or offset + n > len(seeds):
        raise ValueError(f"split '{split}' has {len(seeds)} tasks; asked for {n} from offset {offset}")
    return list(seeds[offset:offset + n])


def split_of(seed: int) -> str | None:
    return next((name for name, seeds in SPLITS.items() if seed in seeds), None)


class SubTask(BaseModel):
    """One request of the user, with everything the reward and the reference policies need."""

    model_config = ConfigDict(extra="forbid")

    kind: SubTaskKind
    reservation_id: str
    allowed: bool
    rule: str  # why it is allowed or forbidden, in policy words
    request: str  # the user's words
    reason: str | None = None  # cancel: the reason, in the user's words
    payment: str | None = None  # change / bags: the payment id the user names ("gift_card_harp")
    reads: list[Action]  # what the oracle reads for this sub-task, in order
    writes: list[Action]  # gold writes (empty when forbidden)
    communicate: list[str]
    reasoning_args: list[str]  # arguments of writes[0] whose value is chosen or computed from records
    say: str  # the oracle's confirmation (allowed) or refusal (forbidden)
    check: str = ""  # the rule check a `rule_check` teacher says before `say` (cancel, certificate; policy.cancel_check)
    cited_check: str = ""  # the same check with the values each answer is read from (policy.cancel_check's `cite`)
    mispick_writes: list[Action] | None = None  # structured-reasoning fault: a wrong pick / amount (a cancellation has none)
    mispick_say: str | None = None
    anyway_reads: list[Action] = Field(default_factory=list)  # precondition fault: reads made when ignoring the rule
    anyway_writes: list[Action] = Field(default_factory=list)  # … and the forbidden writes
    anyway_say: str | None = None


class AirlineTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int
    task_id: str
    task_kind: str  # the sub-task kind, or "multi"
    user_id: str
    opening: str  # the user's first message: the first request (the others come one at a time)
    db: AirlineDB  # the initial database; never mutated (environments work on a copy)
    subtasks: list[SubTask]

    @property
    def gold_actions(self) -> list[Action]:
        return [a for sub in self.subtasks for a in sub.writes]

    @property
    def communicate_info(self) -> list[str]:
        return [c for sub in self.subtasks for c in sub.communicate]

    @property
    def reasoning_args(self) -> list[list[Any]]:
        """[gold action index, argument name] for every argument computed or chosen from records."""
        out, index = [], 0
        for sub in self.subtasks:
            if sub.writes:
                out += [[index, name] for name in sub.reasoning_args]
            index += len(sub.writes)
        return out

    def info(self) -> dict[str, Any]:
        """The `info` of `env.reset` (the private `_task` is added by the environment)."""
        return {
            "task_id": self.task_id,
            "task_kind": self.task_kind,
            "gold_actions": [a.model_dump() for a in self.gold_actions],
            "communicate_info": self.communicate_info,
            "reasoning_args": self.reasoning_args,
            "subtasks": [{"kind": s.kind, "reservation_id": s.reservation_id, "allowed": s.allowed} for s in self.subtasks],
        }


def generate_task(seed: int) -> AirlineTask:
    """The task of `seed` (a pure function of the seed)."""
    return _Builder(seed).build()


def _pick(rng: random.Random, weighted: tuple[tuple[Any, float], ...]) -> Any:
    return rng.choices([v for v, _ in weighted], weights=[w for _, w in weighted])[0]


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M")


def _day(offset: int) -> str:
    return (datetime.strptime(NOW, "%Y-%m-%d %H:%M") + timedelta(days=offset)).strftime("%Y-%m-%d")


def _wrong_number(correct: int, candidates: list[int]) -> int:
    """The first candidate that differs from `correct` and whose text neither contains nor is inside it."""
    for value in [*candidates, correct + 70, correct + 130]:
        a, b = str(abs(value)), str(abs(correct))
        if value > 0 and a not in b and b not in a:
            return value
    raise AssertionError("unreachable: correct + 70 and correct + 130 cannot both overlap")


class _Builder:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(f"tracerl-airline-{seed}")
        self.db = AirlineDB()
        self.used: set[str] = set()

    # --- ids and records -------------------------------------------------------------------
    def _unique(self, make) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def reservation_id(self) -> str:
        return self._unique(lambda: self.rng.choice(CODE_WORDS))

    def flight_number(self) -> str:
        return self._unique(lambda: f"HAT{self.rng.randrange(100, 1000)}")

    def prices(self) -> dict[str, int]:
        basic = self.rng.randrange(60, 200)
        economy = basic + self.rng.randrange(30, 120)
        return {"basic_economy": basic, "economy": economy, "business": economy * 2 + self.rng.randrange(0, 150)}

    def route(self) -> tuple[str, str]:
        """An origin/destination pair no other reservation of the task uses (searches stay unambiguous)."""
        while True:
            origin, destination = self.rng.sample(AIRPORTS, 2)
            pair = "-".join(sorted((origin, destination)))
            if pair not in self.used:
                self.used.add(pair)
                return origin, destination

    def add_flight(self, origin: str, destination: str, date: str, status: str, depart: str | None = None) -> Flight:
        depart = depart or f"{self.rng.randrange(6, 22):02d}:00"
        flight = Flight(flight_number=self.flight_number(), origin=origin, destination=destination, date=date,
                        depart=depart, status=status, prices=self.prices())
        self.db.flights[flight.key] = flight
        return flight

    def make_user(self) -> User:
        first, last = self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES)
        user_id = f"{first}_{last}_{self.rng.choice(ID_WORDS)}"
        word = lambda prefix: self._unique(lambda: f"{prefix}_{self.rng.choice(ID_WORDS)}")  # noqa: E731
        methods = [PaymentMethod(payment_id=word("credit_card"), source="credit_card"),
                   PaymentMethod(payment_id=word("gift_card"), source="gift_card")]
        self.rng.shuffle(methods)
        membership = _pick(self.rng, (("regular", 0.5), ("silver", 0.3), ("gold", 0.2)))
        user = User(user_id=user_id, name=f"{first.title()} {last.title()}", membership=membership,
                    payment_methods=methods, reservations=[])
        self.db.users[user_id] = user
        return user

    def add_reservation(
        self, user: User, *, cabin: str, round_trip: bool, passengers: int, created_at: str, insurance: str,
        statuses: tuple[str, ...] = ("available", "available"), total_bags: int | None = None,
        depart_day: int | None = None,
    ) -> Reservation:
        origin, destination = self.route()
        if statuses[0] == "landed":
            day = -self.rng.randrange(1, 6)
        else:
            day = depart_day if depart_day is not None else self.rng.randrange(2, 10)
        legs = [(origin, destination, day)]
        if round_trip:
            back = max(day, 1) + self.rng.randrange(2, 7)
            legs.append((destination, origin, back))
        segments = []
        for (o, d, offset), status in zip(legs, statuses, strict=False):
            flight = self.add_flight(o, d, _day(offset), status)
            segments.append(ReservedFlight(flight_number=flight.flight_number, date=flight.date, price=flight.prices[cabin]))
        people = [Passenger(first_name=self.rng.choice(FIRST_NAMES).title(), last_name=user.name.split()[1],
                            dob=f"{self.rng.randrange(1950, 2010)}-{self.rng.randrange(1, 13):02d}-{self.rng.randrange(1, 29):02d}")
                  for _ in range(passengers)]
        free = free_bags(user.membership, cabin, passengers)
        total = self.rng.randrange(0, free + 2) if total_bags is None else total_bags
        nonfree = max(0, total - free)
        fare = sum(s.price for s in segments) * passengers + (30 * passengers if insurance == "yes" else 0)
        card = self.rng.choice(user.payment_methods).payment_id
        history = [Payment(payment_id=card, amount=fare + nonfree * BAG_FEE)]  # one payment: the refund is the amount read
        reservation = Reservation(
            reservation_id=self.reservation_id(), user_id=user.user_id, origin=origin, destination=destination,
            flight_type="round_trip" if round_trip else "one_way", cabin=cabin, flights=segments,
            passengers=people, payment_history=history, created_at=created_at, total_baggages=total,
            nonfree_baggages=nonfree, insurance=insurance,
        )
        self.db.reservations[reservation.reservation_id] = reservation
        user.reservations.append(reservation.reservation_id)
        return reservation

    def created(self, recent: bool) -> str:
        now = datetime.strptime(NOW, "%Y-%m-%d %H:%M")
        if recent:
            return _fmt(now - timedelta(hours=self.rng.randrange(1, 24), minutes=self.rng.choice((0, 30))))
        if self.rng.random() < 0.3:  # just past the 24-hour window
            return _fmt(now - timedelta(hours=self.rng.randrange(25, 30)))
        return _fmt(now - timedelta(days=self.rng.randrange(2, 30), hours=self.rng.randrange(0, 12)))

    def payment_choice(self, user: User) -> str:
        return self.rng.choice([m for m in user.payment_methods if m.source != "certificate"]).payment_id

    # --- sub-tasks -------------------------------------------------------------------------
    def cancel(self, user: User, allowed: bool) -> SubTask:
        rng = self.rng
        cause = rng.choice(("recent", "airline", "business", "insurance") if allowed
                           else ("old", "old", "flown", "uncovered", "claimed"))
        plain_reasons = ("change_of_plan", "health", "weather")
        cabin = rng.choice(("economy", "basic_economy"))
        insurance, reason = rng.choice(("yes", "no")), rng.choice(plain_reasons)
        if cause == "business":  # allowed: business class, whatever the reason
            cabin = "business"
        elif cause == "airline":  # allowed: a flight really was cancelled by the airline
            reason = "airline_cancelled"
        elif cause == "insurance":  # allowed: insured, and the reason is covered
            insurance, reason = "yes", rng.choice(("health", "weather"))
        elif cause == "old":  # forbidden: old booking, no insurance, nothing cancelled
            insurance = "no"
        elif cause == "uncovered":  # forbidden: insured, but a change of plan is not covered
            insurance, reason = "yes", "change_of_plan"
        elif cause == "claimed":  # forbidden: the user says the airline cancelled, the records say otherwise
            insurance, reason = "no", "airline_cancelled"
        elif cause == "flown":  # forbidden: a segment was flown, even in business
            cabin = rng.choice(("economy", "basic_economy", "business"))
        round_trip = cause == "flown" or rng.random() < 0.4
        statuses = ("available", "available")
        if cause == "flown":
            statuses = ("landed", "available")
        elif cause == "airline":
            statuses = rng.choice((("cancelled", "available"), ("available", "cancelled"))) if round_trip else ("cancelled",)
        created = self.created(cause == "recent")
        if cause == "flown":
            created = _fmt(datetime.strptime(NOW, "%Y-%m-%d %H:%M") - timedelta(days=rng.randrange(10, 30)))
        reservation = self.add_reservation(
            user, cabin=cabin, round_trip=round_trip, passengers=rng.randrange(1, 4),
            created_at=created, insurance=insurance, statuses=statuses,
        )
        ok, rule = cancel_rule(self.db, reservation, reason)
        assert ok == allowed, (self.seed, cause, rule)
        rid = reservation.reservation_id
        read = Action(name="get_reservation_details", arguments={"reservation_id": rid})
        write = Action(name="cancel_reservation", arguments={"reservation_id": rid})
        request = f"cancel reservation {rid} because of {REASONS[reason]}"
        check, cited_check = (cancel_check(self.db, reservation, reason, cite) for cite in (False, True))
        if not allowed:
            return SubTask(kind="cancel", reservation_id=rid, allowed=False, rule=rule, request=request, reason=REASONS[reason], reads=[read],
                           writes=[], communicate=[], reasoning_args=[],
                           say=f"Sorry, I cannot cancel this reservation: {rule}.", check=check, cited_check=cited_check,
                           anyway_reads=[read], anyway_writes=[write],
                           anyway_say="I will cancel this reservation. Do you confirm?")
        return SubTask(kind="cancel", reservation_id=rid, allowed=True, rule=rule, request=request, reason=REASONS[reason], reads=[read],
                       writes=[write], communicate=[], reasoning_args=[], say="I will cancel this reservation. Do you confirm?",
                       check=check, cited_check=cited_check)

    def change(self, user: User, allowed: bool) -> SubTask:
        rng = self.rng
        cabin = rng.choice(("economy", "business")) if allowed else "basic_economy"
        round_trip = rng.random() < 0.4
        day = rng.randrange(3, 8)
        reservation = self.add_reservation(user, cabin=cabin, round_trip=round_trip, passengers=rng.randrange(1, 4),
                                           created_at=self.created(False), insurance=rng.choice(("yes", "no")),
                                           depart_day=day)
        ok, rule = change_rule(reservation)
        assert ok == allowed
        rid, n = reservation.reservation_id, len(reservation.passengers)
        old = reservation.flights[0]
        new_day = _day(day + rng.choice((-2, -1, 1)))
        constraint = rng.choice(("any", "after", "before"))
        candidates = self._candidates(reservation.origin, reservation.destination, new_day, cabin, constraint, old.price)
        fits = [f for f in candidates if _fits(f.depart, constraint)]
        best = min(fits, key=lambda f: f.prices[cabin])
        if constraint == "any":
            wrong = sorted(fits, key=lambda f: f.prices[cabin])[1]
        else:
            wrong = min(candidates, key=lambda f: f.prices[cabin])
        kept = [{"flight_number": f.flight_number, "date": f.date} for f in reservation.flights[1:]]
        payment_id = self.payment_choice(user)

        def write_for(flight: Flight) -> Action:
            flights = [{"flight_number": flight.flight_number, "date": flight.date}, *kept]
            return Action(name="update_reservation_flights",
                          arguments={"reservation_id": rid, "cabin": cabin, "flights": flights, "payment_id": payment_id})

        def say_for(flight: Flight) -> str:
            keep = "".join(f" and keep flight {k['flight_number']} on {k['date']}" for k in kept)
            return f"I will change this reservation to flight {flight.flight_number} on {flight.date} in {cabin}{keep}. Do you confirm?"

        need = {"any": "", "after": " departing after 12:00", "before": " departing before 12:00"}[constraint]
        request = (f"change flight {old.flight_number} of reservation {rid} to the cheapest direct flight on {new_day}"
                   f"{need}, paid with {payment_id}")
        search = Action(name="search_direct_flight",
                        arguments={"origin": reservation.origin, "destination": reservation.destination, "date": new_day})
        read = Action(name="get_reservation_details", arguments={"reservation_id": rid})
        best_say = say_for(best)
        if not allowed:
            return SubTask(kind="change", reservation_id=rid, allowed=False, rule=rule, request=request, payment=payment_id, reads=[read],
                           writes=[], communicate=[], reasoning_args=[],
                           say=f"Sorry, I cannot change this reservation: {rule}.",
                           anyway_reads=[read, search], anyway_writes=[write_for(best)], anyway_say=best_say)
        return SubTask(kind="change", reservation_id=rid, allowed=True, rule=rule, request=request, payment=payment_id, reads=[read, search],
                       writes=[write_for(best)], communicate=[], reasoning_args=["flights"], say=best_say,
                       mispick_writes=[write_for(wrong)], mispick_say=say_for(wrong))

    def _candidates(self, origin: str, destination: str, date: str, cabin: str, constraint: str, old_price: int) -> list[Flight]:
        """3–4 available flights; ≥ 2 meet the constraint; a constrained search's overall cheapest does not.

        Prices in `cabin` are distinct and at least 10 away from `old_price` (a price difference is never ~0).
        """
        rng = self.rng
        hours = rng.sample(range(6, 22), rng.randrange(3, 5))
        if constraint != "any":
            morning, evening = list(range(6, 12)), list(range(13, 22))
            fit_hours, other = (evening, morning) if constraint == "after" else (morning, evening)
            hours = rng.sample(fit_hours, rng.randrange(2, 4)) + rng.sample(other, 1)
        flights = [self.add_flight(origin, destination, date, "available", depart=f"{h:02d}:00") for h in hours]
        # distinct prices in the cabin; under a constraint, the cheapest overall breaks it
        low, high = (300, 1000) if cabin == "business" else (80, 400)
        values = sorted(rng.sample([v for v in range(low, high) if abs(v - old_price) >= 10], len(flights)))
        fits = [f for f in flights if _fits(f.depart, constraint)]
        others = [f for f in flights if not _fits(f.depart, constraint)]
        order = (others[:1] + fits + others[1:]) if others else fits
        for flight, value in zip(order, values, strict=True):
            flight.prices = _prices_around(cabin, value, rng)
        return flights

    def bags(self, user: User) -> SubTask:
        rng = self.rng
        cabin = rng.choice(("economy", "business") if user.membership == "regular" else ("basic_economy", "economy", "business"))
        n = rng.randrange(1, 4)
        free = free_bags(user.membership, cabin, n)
        current = max(0, free - rng.choice((1, 2)))
        extra = rng.choice((1, 2))
        added = free - current + extra
        reservation = self.add_reservation(user, cabin=cabin, round_trip=rng.random() < 0.4, passengers=n,
                                           created_at=self.created(False), insurance=rng.choice(("yes", "no")),
                                           total_bags=current)
        rid = reservation.reservation_id
        payment_id = self.payment_choice(user)

        def write(total: int, nonfree: int) -> Action:
            return Action(name="update_reservation_baggages", arguments={
                "reservation_id": rid, "total_baggages": total, "nonfree_baggages": nonfree, "payment_id": payment_id})

        def say(total: int, nonfree: int) -> str:
            return (f"I will set this reservation to {total} bags, {nonfree} of them paid. "
                    f"You pay {nonfree * BAG_FEE} dollars. Do you confirm?")

        bag_words = "1 checked bag" if added == 1 else f"{added} checked bags"
        return SubTask(kind="bags", reservation_id=rid, allowed=True, rule=f"{free} free bags", reads=[
            Action(name="get_reservation_details", arguments={"reservation_id": rid})],
            request=f"add {bag_words} to reservation {rid}, paid with {payment_id}", payment=payment_id,
            writes=[write(current + added, extra)], communicate=[str(extra * BAG_FEE)],
            reasoning_args=["total_baggages", "nonfree_baggages"], say=say(current + added, extra),
            mispick_writes=[write(current + added, added)], mispick_say=say(current + added, added))

    def certificate(self, user: User, allowed: bool) -> SubTask:
        rng = self.rng
        n = rng.randrange(1, 4)
        claimed = not allowed and rng.random() < 0.3
        if allowed:
            cause = rng.choice(tuple(c for c in ("member", "insurance", "business") if c != "member" or user.membership != "regular"))
            insurance = "yes" if cause == "insurance" else rng.choice(("yes", "no"))
            cabin = "business" if cause == "business" else rng.choice(("basic_economy", "economy", "business"))
        elif claimed:
            insurance, cabin = rng.choice(("yes", "no")), rng.choice(("basic_economy", "economy", "business"))
        else:
            if user.membership != "regular":
                user.membership = "regular"  # ineligible needs a regular member (the user has no other compensation request)
            insurance, cabin = "no", rng.choice(("basic_economy", "economy"))
        round_trip = rng.random() < 0.4
        statuses = ("available", "available") if claimed else rng.choice((("cancelled", "available"), ("available", "cancelled")))
        if not round_trip:
            statuses = (statuses[0] if claimed else "cancelled",)
        reservation = self.add_reservation(user, cabin=cabin, round_trip=round_trip, passengers=n,
                                           created_at=self.created(False), insurance=insurance, statuses=statuses)
        ok, rule = compensation_rule(self.db, user, reservation)
        assert ok == allowed, (self.seed, rule)
        rid, amount = reservation.reservation_id, CERTIFICATE_PER_PASSENGER * n
        read = Action(name="get_reservation_details", arguments={"reservation_id": rid})

        def write(value: int) -> Action:
            return Action(name="send_certificate", arguments={"user_id": user.user_id, "amount": value})

        def say(value: int) -> str:
            return f"I will send you a certificate of {value} dollars. Do you confirm?"

        request = f"get compensation for the cancelled flight in reservation {rid}"
        check, cited_check = (compensation_check(self.db, user, reservation, cite) for cite in (False, True))
        if not allowed:
            return SubTask(kind="certificate", reservation_id=rid, allowed=False, rule=rule, request=request, reads=[read],
                           writes=[], communicate=[], reasoning_args=[],
                           say=f"Sorry, I cannot offer compensation for this reservation: {rule}.", check=check, cited_check=cited_check,
                           anyway_reads=[read], anyway_writes=[write(amount)], anyway_say=say(amount))
        wrong = _wrong_number(amount, [50 * n, amount + 100])
        return SubTask(kind="certificate", reservation_id=rid, allowed=True, rule=rule, request=request, reads=[read],
                       writes=[write(amount)], communicate=[str(amount)], reasoning_args=["amount"], say=say(amount),
                       check=check, cited_check=cited_check, mispick_writes=[write(wrong)], mispick_say=say(wrong))

    # --- the task --------------------------------------------------------------------------
    def build(self) -> AirlineTask:
        rng = self.rng
        user = self.make_user()
        kind = _pick(rng, _SINGLE_KINDS)
        if kind == "multi":
            size = _pick(rng, _MULTI_SIZES)
            kinds = [_pick(rng, _MULTI_KINDS) for _ in range(size)]
            while kinds.count("certificate") > 1:  # at most one compensation request per user
                kinds[kinds.index("certificate")] = "bags"
        else:
            kinds = [kind]
        rates = _ALLOWED_RATES["multi" if len(kinds) > 1 else "single"]
        # an ineligible compensation request turns the user into a regular member: decide it first
        subtasks: list[SubTask | None] = [None] * len(kinds)
        order = sorted(range(len(kinds)), key=lambda i: kinds[i] != "certificate")
        for i in order:
            k = kinds[i]
            allowed = rng.random() < rates.get(k, 1.0)
            if k == "cancel":
                subtasks[i] = self.cancel(user, allowed)
            elif k == "change":
                subtasks[i] = self.change(user, allowed)
            elif k == "bags":
                subtasks[i] = self.bags(user)
            else:
                subtasks[i] = self.certificate(user, allowed)
        subs = [s for s in subtasks if s is not None]
        if rng.random() < 0.5:  # a reservation the user does not ask about
            self.add_reservation(user, cabin=rng.choice(("economy", "business")), round_trip=False,
                                 passengers=rng.randrange(1, 3), created_at=self.created(False), insurance="no")
        rng.shuffle(user.reservations)
        opening = opening_text([s.request for s in subs])
        return AirlineTask(seed=self.seed, task_id=f"airline-{self.seed}", task_kind=kind, user_id=user.user_id,
                           opening=opening, db=self.db, subtasks=subs)


def _prices_around(cabin: str, value: int, rng: random.Random) -> dict[str, int]:
    """A price table whose `cabin` price is `value`, the other cabins in the usual order."""
    if cabin == "business":
        economy = value // 2 - rng.randrange(0, 40)
        return {"basic_economy": max(40, economy - rng.randrange(30, 90)), "economy": economy, "business": value}
    basic = max(40, value - rng.randrange(30, 90)) if cabin == "economy" else value
    economy = value if cabin == "economy" else value + rng.randrange(30, 90)
    return {"basic_economy": basic, "economy": economy, "business": economy * 2 + rng.randrange(0, 150)}


def _fits(depart: str, constraint: str) -> bool:
    hour = int(depart[:2])
    return constraint == "any" or (constraint == "after" and hour > 12) or (constraint == "before" and hour < 12)
