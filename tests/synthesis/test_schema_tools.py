"""Tools behind a given schema (envs.tools.SchemaTool): arguments validated against the schema's JSON types."""

import json

from tracerl.envs.tools import Toolbox, add_schema_tool


def test_arguments_are_validated_against_the_schema(tau2_airline):
    box = Toolbox()
    seen = []
    add_schema_tool(box, tau2_airline.tool("update_reservation_baggages"), lambda **kw: seen.append(kw) or {"ok": True})
    add_schema_tool(box, tau2_airline.tool("book_reservation"), lambda **kw: kw)
    good = {"reservation_id": "ZFA04Y", "total_baggages": 2, "nonfree_baggages": 1, "payment_id": "gift_card_1"}
    assert box.call("update_reservation_baggages", json.dumps(good)) == '{"ok": true}'
    assert seen == [good]
    assert box.call("update_reservation_baggages", {**good, "total_baggages": "2"}) == '{"ok": true}'  # lax, like τ²
    assert seen[-1]["total_baggages"] == 2
    assert box.call("update_reservation_baggages", {**good, "total_baggages": "two"}).startswith(
        "Error: invalid arguments for 'update_reservation_baggages': total_baggages:")
    missing = {k: v for k, v in good.items() if k != "payment_id"}
    assert box.call("update_reservation_baggages", missing).endswith("payment_id: Field required")
    assert "extra" in box.call("update_reservation_baggages", {**good, "extra": 1})
    booking = {"user_id": "u", "origin": "SFO", "destination": "JFK", "flight_type": "one_way", "cabin": "economy",
               "flights": [{"flight_number": "HAT001", "date": "2024-05-01"}],
               "passengers": [{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}],
               "payment_methods": [{"payment_id": "credit_card_1", "amount": 100}],
               "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"}
    assert json.loads(box.call("book_reservation", booking)) == booking  # nested $defs objects arrive as dicts
    assert "cabin" in box.call("book_reservation", {**booking, "cabin": "first"})  # enum
    # τ²'s schema lets a flight be a FlightInfo or any object (anyOf), but not a string
    assert box.call("book_reservation", {**booking, "flights": [{"flight_number": "HAT001"}]}).startswith("{")
    assert "flights.0" in box.call("book_reservation", {**booking, "flights": ["HAT001"]})
    assert [s.name for s in box.schemas] == ["update_reservation_baggages", "book_reservation"]
    assert box.schemas[0] == tau2_airline.tool("update_reservation_baggages")
    assert box.kind_of("book_reservation") == "write"
