"""Airline tools: τ²-bench interface fidelity, and each tool's effect checked against hand-computed values."""

import json

import pytest

from tracerl.core.tools import load_tools_json
from tracerl.envs.airline.data_model import (
    AirlineDB, Flight, Passenger, Payment, PaymentMethod, Reservation, ReservedFlight, User,
)
from tracerl.envs.airline.tools import AirlineTools

REQUIRED = {
    "get_user_details", "get_reservation_details", "search_direct_flight", "cancel_reservation",
    "update_reservation_flights", "update_reservation_baggages", "send_certificate", "calculate",
    "transfer_to_human_agents",
}


def test_schemas_match_tau2_tools_json(tau2_data):
    """Same tool names, parameter names, JSON types, required lists and kinds as τ²-bench's airline tools."""
    theirs = {t.name: t for t in load_tools_json(tau2_data / "airline" / "tools.json")}
    ours = {t.name: t for t in AirlineTools().schemas}
    assert set(ours) == REQUIRED
    for name, schema in ours.items():
        assert schema.parameter_signature() == theirs[name].parameter_signature(), name
        assert schema.kind == theirs[name].kind, name
        assert schema.description, name


def _db() -> AirlineDB:
    """One silver user with a 2-passenger economy round trip (fare 2 × (200 + 150) = 700, one paid bag)."""
    flights = [
        Flight(flight_number="HAT100", origin="JFK", destination="LAX", date="2024-05-20", depart="09:00",
               status="available", prices={"basic_economy": 120, "economy": 200, "business": 500}),
        Flight(flight_number="HAT200", origin="LAX", destination="JFK", date="2024-05-25", depart="10:00",
               status="available", prices={"basic_economy": 100, "economy": 150, "business": 450}),
        Flight(flight_number="HAT300", origin="JFK", destination="LAX", date="2024-05-19", depart="14:00",
               status="available", prices={"basic_economy": 110, "economy": 260, "business": 520}),
        Flight(flight_number="HAT400", origin="JFK", destination="LAX", date="2024-05-19", depart="08:00",
               status="cancelled", prices={"basic_economy": 90, "economy": 180, "business": 400}),
    ]
    user = User(user_id="mia_lee_123", name="Mia Lee", membership="silver", reservations=["ABC123"],
                payment_methods=[PaymentMethod(payment_id="credit_card_1111", source="credit_card"),
                                 PaymentMethod(payment_id="gift_card_2222", source="gift_card")])
    reservation = Reservation(
        reservation_id="ABC123", user_id="mia_lee_123", origin="JFK", destination="LAX", flight_type="round_trip",
        cabin="economy", flights=[ReservedFlight(flight_number="HAT100", date="2024-05-20", price=200),
                                  ReservedFlight(flight_number="HAT200", date="2024-05-25", price=150)],
        passengers=[Passenger(first_name="Mia", last_name="Lee", dob="1990-01-01"),
                    Passenger(first_name="Leo", last_name="Lee", dob="1992-02-02")],
        payment_history=[Payment(payment_id="credit_card_1111", amount=700), Payment(payment_id="credit_card_1111", amount=50)],
        created_at="2024-05-01 10:00", total_baggages=5, nonfree_baggages=1, insurance="no",
    )
    return AirlineDB(users={user.user_id: user}, reservations={"ABC123": reservation},
                     flights={f.key: f for f in flights})


def call(tools: AirlineTools, name: str, **arguments):
    text = tools.call(name, json.dumps(arguments))
    return text if text.startswith("Error:") else json.loads(text)


def test_reads_are_compact_and_exact():
    tools = AirlineTools(_db())
    user = call(tools, "get_user_details", user_id="mia_lee_123")
    assert user == {"user_id": "mia_lee_123", "name": "Mia Lee", "membership": "silver",
                    "payment_methods": ["credit_card_1111", "gift_card_2222"], "reservations": ["ABC123"]}
    res = call(tools, "get_reservation_details", reservation_id="ABC123")
    assert res["passengers"] == 2 and res["cabin"] == "economy" and res["total_baggages"] == 5
    assert [f["status"] for f in res["flights"]] == ["available", "available"]
    found = call(tools, "search_direct_flight", origin="JFK", destination="LAX", date="2024-05-19")
    assert [f["flight_number"] for f in found] == ["HAT300"]  # the cancelled HAT400 is not offered
    assert call(tools, "get_user_details", user_id="nobody_1") == "Error: user nobody_1 not found"


def test_cancel_refunds_every_payment():
    tools = AirlineTools(_db())
    assert call(tools, "cancel_reservation", reservation_id="ABC123") == {"reservation_id": "ABC123", "status": "cancelled"}
    res = tools.db.reservations["ABC123"]
    assert res.status == "cancelled"
    assert [p.amount for p in res.payment_history] == [700, 50, -700, -50]
    assert call(tools, "cancel_reservation", reservation_id="ABC123").startswith("Error:")


def test_change_flight_charges_the_price_difference_times_passengers():
    tools = AirlineTools(_db())
    # outbound HAT100 (200) -> HAT300 (260 economy), return kept at its paid price: (260 - 200) × 2 = 120
    out = call(tools, "update_reservation_flights", reservation_id="ABC123", cabin="economy", payment_id="gift_card_2222",
               flights=[{"flight_number": "HAT300", "date": "2024-05-19"}, {"flight_number": "HAT200", "date": "2024-05-25"}])
    assert out == {"reservation_id": "ABC123", "status": "updated"}
    res = tools.db.reservations["ABC123"]
    assert [(f.flight_number, f.price) for f in res.flights] == [("HAT300", 260), ("HAT200", 150)]
    assert res.payment_history[-1] == Payment(payment_id="gift_card_2222", amount=120)


@pytest.mark.parametrize("arguments, error", [
    ({"flights": [{"flight_number": "HAT400", "date": "2024-05-19"}]}, "not available"),
    ({"flights": [{"flight_number": "HAT999", "date": "2024-05-19"}]}, "not found"),
    ({"flights": ["HAT300"]}, "invalid arguments"),
    ({"flights": [{"flight_number": "HAT300"}]}, "invalid flight"),
    ({"payment_id": "gift_card_9999"}, "payment method gift_card_9999 not found"),
    ({"cabin": "first"}, "invalid arguments"),
])
def test_bad_flight_changes_are_errors_and_change_nothing(arguments, error):
    tools = AirlineTools(_db())
    before = tools.db.digest()
    base = {"reservation_id": "ABC123", "cabin": "economy", "payment_id": "gift_card_2222",
            "flights": [{"flight_number": "HAT300", "date": "2024-05-19"}]}
    text = tools.call("update_reservation_flights", {**base, **arguments})
    assert text.startswith("Error:") and error in text
    assert tools.db.digest() == before


def test_bags_pay_only_the_new_nonfree_bags():
    tools = AirlineTools(_db())
    # silver economy: (1 + 1) × 2 passengers = 4 free; 5 bags -> 8 bags means 4 non-free, 3 more than before: 150
    call(tools, "update_reservation_baggages", reservation_id="ABC123", total_baggages=8, nonfree_baggages=4,
         payment_id="credit_card_1111")
    res = tools.db.reservations["ABC123"]
    assert (res.total_baggages, res.nonfree_baggages) == (8, 4)
    assert res.payment_history[-1] == Payment(payment_id="credit_card_1111", amount=150)
    before = tools.db.digest()
    assert call(tools, "update_reservation_baggages", reservation_id="ABC123", total_baggages="nine",
                nonfree_baggages=4, payment_id="credit_card_1111").startswith("Error: invalid arguments")
    assert call(tools, "update_reservation_baggages", reservation_id="ABC123", total_baggages=3,
                nonfree_baggages=4, payment_id="credit_card_1111").startswith("Error:")
    assert tools.db.digest() == before


def test_certificate_becomes_a_payment_method():
    tools = AirlineTools(_db())
    assert call(tools, "send_certificate", user_id="mia_lee_123", amount=200) == {"payment_id": "certificate_0001", "amount": 200}
    assert tools.db.users["mia_lee_123"].payment("certificate_0001").amount == 200
    assert call(tools, "send_certificate", user_id="mia_lee_123", amount="200 dollars").startswith("Error: invalid arguments")


def test_calculate_and_transfer():
    tools = AirlineTools(_db())
    assert tools.call("calculate", {"expression": "(260 - 200) * 2 + 3 / 4"}) == "120.75"
    assert tools.call("calculate", {"expression": "__import__('os')"}).startswith("Error: invalid expression")
    assert tools.call("calculate", {"expression": "1 / 0"}) == "Error: division by zero"
    assert tools.call("transfer_to_human_agents", {"summary": "flown segment"}) == "Transfer successful"


def test_each_toolbox_gets_its_own_schema_copies():
    """Tool schemas are derived once per function; every Toolbox still gets copies it may change."""
    a, b = AirlineTools(), AirlineTools()
    a.schemas[0].parameters["properties"].clear()
    assert b.schemas[0].parameters["properties"] and AirlineTools().schemas[0].parameters["properties"]
