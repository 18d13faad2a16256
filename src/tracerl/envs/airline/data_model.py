"""The airline database: users, flights, reservations — pydantic records, hashable as a canonical dump.

`FlightInfo`, `Passenger` and `Payment` are also the nested argument types of the tools (same
field names and JSON types as τ²-bench's airline tools.json).
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.messages import canonical_json

Cabin = Literal["business", "economy", "basic_economy"]
Membership = Literal["regular", "silver", "gold"]
FlightStatus = Literal["available", "cancelled", "landed"]
CABINS: tuple[str, ...] = ("basic_economy", "economy", "business")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FlightInfo(_Record):
    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(description="Date, such as '2024-05-01'.")


class Passenger(_Record):
    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth in YYYY-MM-DD format")


class Payment(_Record):
    payment_id: str = Field(description="Unique identifier for the payment")
    amount: int = Field(description="Payment amount in dollars")


class Flight(_Record):
    """One flight on one date."""

    flight_number: str
    origin: str
    destination: str
    date: str
    depart: str  # "HH:MM", local time
    status: FlightStatus
    prices: dict[str, int]  # cabin -> price per passenger

    @property
    def key(self) -> str:
        return flight_key(self.flight_number, self.date)


class PaymentMethod(_Record):
    payment_id: str  # "credit_card_violin", "gift_card_harp", "certificate_0001"
    source: Literal["credit_card", "gift_card", "certificate"]
    amount: int | None = None  # certificates: the value


class User(_Record):
    user_id: str
    name: str
    membership: Membership
    payment_methods: list[PaymentMethod]
    reservations: list[str]

    def payment(self, payment_id: str) -> PaymentMethod | None:
        return next((p for p in self.payment_methods if p.payment_id == payment_id), None)


class ReservedFlight(_Record):
    flight_number: str
    date: str
    price: int  # per passenger, as paid


class Reservation(_Record):
    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: Literal["one_way", "round_trip"]
    cabin: Cabin
    flights: list[ReservedFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str  # "YYYY-MM-DD HH:MM"
    total_baggages: int
    nonfree_baggages: int
    insurance: Literal["yes", "no"]
    status: Literal["active", "cancelled"] = "active"


class AirlineDB(_Record):
    users: dict[str, User] = Field(default_factory=dict)
    reservations: dict[str, Reservation] = Field(default_factory=dict)
    flights: dict[str, Flight] = Field(default_factory=dict)  # key: flight_key(number, date)

    def flight(self, flight_number: str, date: str) -> Flight | None:
        return self.flights.get(flight_key(flight_number, date))

    def digest(self) -> str:
        """SHA-256 of the canonical JSON dump: equal databases ⇔ equal digests."""
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()


def flight_key(flight_number: str, date: str) -> str:
    return f"{flight_number}@{date}"
