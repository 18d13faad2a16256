"""The airline tools: names, parameter names and JSON types as in τ²-bench's airline tools.json.

Results are compact JSON (they go into a small model's context). Like τ²-bench's, the write
tools do not check the policy rules — the agent must. They do check that ids exist and that the
arguments make sense, and they change nothing when they answer with an error.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Literal

from pydantic import ValidationError

from tracerl.envs.airline.data_model import (
    AirlineDB,
    FlightInfo,
    Payment,
    PaymentMethod,
    Reservation,
    ReservedFlight,
    User,
)
from tracerl.envs.airline.policy import BAG_FEE, flight_statuses
from tracerl.envs.tools import Toolbox, ToolError, tool


class AirlineTools(Toolbox):
    """The tools, bound to one database (`self.db`, replaced between episodes with `bind`)."""

    def __init__(self, db: AirlineDB | None = None):
        super().__init__()
        self.db = db if db is not None else AirlineDB()

    def bind(self, db: AirlineDB) -> AirlineTools:
        self.db = db
        return self

    # --- lookups -------------------------------------------------------------------------
    def _user(self, user_id: str) -> User:
        user = self.db.users.get(user_id)
        if user is None:
            raise ToolError(f"user {user_id} not found")
        return user

    def _reservation(self, reservation_id: str) -> Reservation:
        reservation = self.db.reservations.get(reservation_id)
        if reservation is None:
            raise ToolError(f"reservation {reservation_id} not found")
        return reservation

    def _payment_method(self, reservation: Reservation, payment_id: str) -> PaymentMethod:
        method = self._user(reservation.user_id).payment(payment_id)
        if method is None:
            raise ToolError(f"payment method {payment_id} not found")
        if method.source == "certificate":
            raise ToolError("a certificate cannot be used for this payment")
        return method

    def reservation_view(self, reservation: Reservation) -> dict[str, Any]:
        statuses = flight_statuses(self.db, reservation)
        return {
            "reservation_id": reservation.reservation_id,
            "user_id": reservation.user_id,
            "origin": reservation.origin,
            "destination": reservation.destination,
            "flight_type": reservation.flight_type,
            "cabin": reservation.cabin,
            "flights": [
                {"flight_number": f.flight_number, "date": f.date, "price": f.price, "status": s}
                for f, s in zip(reservation.flights, statuses, strict=True)
            ],
            "passengers": len(reservation.passengers),
            "created_at": reservation.created_at,
            "insurance": reservation.insurance,
            "total_baggages": reservation.total_baggages,
            "nonfree_baggages": reservation.nonfree_baggages,
            "payment_history": [p.model_dump() for p in reservation.payment_history],
            "status": reservation.status,
        }

    # --- read ------------------------------------------------------------------------------
    @tool("read")
    def get_user_details(self, user_id: str) -> dict:
        """Get the details of a user: membership, payment methods and reservation ids.

        Args:
            user_id: The user ID, such as 'sara_doe_plum'.
        """
        user = self._user(user_id)
        return {
            "user_id": user.user_id,
            "name": user.name,
            "membership": user.membership,
            "payment_methods": [p.payment_id for p in user.payment_methods],
            "reservations": list(user.reservations),
        }

    @tool("read")
    def get_reservation_details(self, reservation_id: str) -> dict:
        """Get the details of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'wren'.
        """
        return self.reservation_view(self._reservation(reservation_id))

    @tool("read")
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list:
        """Search the available direct flights between two cities on a date, with prices per cabin.

        Args:
            origin: The origin airport code, such as 'JFK'.
            destination: The destination airport code, such as 'LAX'.
            date: The date, such as '2024-05-20'.
        """
        found = [
            f for f in self.db.flights.values()
            if f.origin == origin and f.destination == destination and f.date == date and f.status == "available"
        ]
        found.sort(key=lambda f: (f.depart, f.flight_number))
        return [{"flight_number": f.flight_number, "depart": f.depart, "prices": f.prices} for f in found]

    # --- write -----------------------------------------------------------------------------
    @tool("write")
    def cancel_reservation(self, reservation_id: str) -> dict:
        """Cancel the whole reservation; the payments are refunded to their methods.

        Args:
            reservation_id: The reservation ID, such as 'maple'.
        """
        reservation = self._reservation(reservation_id)
        if reservation.status == "cancelled":
            raise ToolError(f"reservation {reservation_id} is already cancelled")
        refunds = [Payment(payment_id=p.payment_id, amount=-p.amount) for p in reservation.payment_history]
        reservation.payment_history.extend(refunds)
        reservation.status = "cancelled"
        return {"reservation_id": reservation_id, "status": "cancelled"}

    @tool("write")
    def update_reservation_flights(
        self,
        reservation_id: str,
        cabin: Literal["business", "economy", "basic_economy"],
        flights: list[FlightInfo | dict[str, Any]],
        payment_id: str,
    ) -> dict:
        """Update the flights of a reservation; the price difference is paid or refunded with payment_id.

        Args:
            reservation_id: The reservation ID, such as 'maple'.
            cabin: The cabin class of the reservation.
            flights: Every flight of the new reservation ({flight_number, date}), unchanged ones included.
            payment_id: A payment id from the user profile, such as 'credit_card_violin'.
        """
        reservation = self._reservation(reservation_id)
        if reservation.status == "cancelled":
            raise ToolError(f"reservation {reservation_id} is cancelled")
        infos = [_flight_info(f) for f in flights]
        if not infos:
            raise ToolError("flights must not be empty")
        old = {(f.flight_number, f.date): f.price for f in reservation.flights}
        new_flights = []
        for info in infos:
            flight = self.db.flight(info.flight_number, info.date)
            if flight is None:
                raise ToolError(f"flight {info.flight_number} on {info.date} not found")
            if (info.flight_number, info.date) in old and cabin == reservation.cabin:
                price = old[(info.flight_number, info.date)]
            elif flight.status != "available":
                raise ToolError(f"flight {info.flight_number} on {info.date} is not available")
            else:
                price = flight.prices[cabin]
            new_flights.append(ReservedFlight(flight_number=info.flight_number, date=info.date, price=price))
        self._payment_method(reservation, payment_id)
        passengers = len(reservation.passengers)
        difference = (sum(f.price for f in new_flights) - sum(f.price for f in reservation.flights)) * passengers
        reservation.flights = new_flights
        reservation.cabin = cabin
        if difference:
            reservation.payment_history.append(Payment(payment_id=payment_id, amount=difference))
        return {"reservation_id": reservation_id, "status": "updated"}

    @tool("write")
    def update_reservation_baggages(self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str) -> dict:
        """Update the checked bags of a reservation; extra non-free bags are paid with payment_id.

        Args:
            reservation_id: The reservation ID, such as 'maple'.
            total_baggages: The new total number of checked bags.
            nonfree_baggages: The new number of paid checked bags.
            payment_id: A payment id from the user profile, such as 'credit_card_violin'.
        """
        reservation = self._reservation(reservation_id)
        if reservation.status == "cancelled":
            raise ToolError(f"reservation {reservation_id} is cancelled")
        if not 0 <= nonfree_baggages <= total_baggages:
            raise ToolError("need 0 <= nonfree_baggages <= total_baggages")
        self._payment_method(reservation, payment_id)
        fee = (nonfree_baggages - reservation.nonfree_baggages) * BAG_FEE
        reservation.total_baggages = total_baggages
        reservation.nonfree_baggages = nonfree_baggages
        if fee > 0:
            reservation.payment_history.append(Payment(payment_id=payment_id, amount=fee))
        return {"reservation_id": reservation_id, "status": "updated"}

    @tool("write")
    def send_certificate(self, user_id: str, amount: int) -> dict:
        """Send a travel certificate to a user as compensation.

        Args:
            user_id: The user ID, such as 'sara_doe_plum'.
            amount: The amount of the certificate to send.
        """
        user = self._user(user_id)
        if amount <= 0:
            raise ToolError("amount must be positive")
        count = sum(1 for p in user.payment_methods if p.source == "certificate") + 1
        payment_id = f"certificate_{count:04d}"
        user.payment_methods.append(PaymentMethod(payment_id=payment_id, source="certificate", amount=amount))
        return {"payment_id": payment_id, "amount": amount}

    # --- generic ---------------------------------------------------------------------------
    @tool("generic")
    def calculate(self, expression: str) -> str:
        """Calculate the result of a mathematical expression.

        Args:
            expression: Numbers, + - * / and parentheses, such as '(260 - 200) * 2'.
        """
        value = evaluate_arithmetic(expression)
        return str(round(value, 2))

    @tool("generic")
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"


def _flight_info(value: FlightInfo | dict[str, Any]) -> FlightInfo:
    if isinstance(value, FlightInfo):
        return value
    try:
        return FlightInfo.model_validate(value)
    except ValidationError as e:
        err = e.errors()[0]
        raise ToolError(f"invalid flight {value}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def evaluate_arithmetic(expression: str) -> float:
    """Numbers, + - * /, parentheses: anything else is a ToolError (no eval)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ToolError(f"invalid expression '{expression}'") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ToolError("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ToolError(f"invalid expression '{expression}': only numbers, + - * / and parentheses")

    return value(tree.body)
