import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventbus.model.errors import InvalidEvent
from eventbus.model.event import event_from_document, json_object, parse_event

META = {"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"}
GOOD = {"event_type": "OR_MGMT", "event_version": "v2", "entity_metadata": META,
        "entity_data": {"orderId": 1}}


def dump(value: object) -> bytes:
    return json.dumps(value).encode()


def test_valid_event_keeps_entity_data_as_is() -> None:
    event = parse_event(dump(GOOD))
    assert event.event_type == "OR_MGMT" and event.event_version == "v2"
    assert event.event_direction == "IN"
    assert event.entity_metadata.entity_id == "order-1"
    assert event.entity_data == {"orderId": 1}


def test_attributes_fill_missing_fields() -> None:
    body = {k: v for k, v in GOOD.items() if k not in ("event_type", "event_version")}
    event = parse_event(dump(body), {"event_type": "SUB_MGMT", "event_version": "v3"})
    assert (event.event_type, event.event_version) == ("SUB_MGMT", "v3")


def test_attribute_that_disagrees_with_the_body_is_invalid() -> None:
    with pytest.raises(InvalidEvent, match="in the attributes"):
        parse_event(dump(GOOD), {"event_type": "SUB_MGMT"})


@pytest.mark.parametrize(("change", "message"), [
    ({"event_type": None}, "event_type is missing"),
    ({"event_type": "has space"}, "must match"),
    ({"event_version": "2"}, "look like"),
    ({"event_direction": "SIDEWAYS"}, "event_direction"),
    ({"entity_metadata": {"partnerId": "p"}}, "entity_id"),
    ({"entity_metadata": "x"}, "entity_metadata must be a JSON object"),
    ({"entity_data": [1]}, "entity_data must be a JSON object"),
])
def test_bad_fields_name_the_problem(change: dict[str, object], message: str) -> None:
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(InvalidEvent, match=message):
        parse_event(dump(body))


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"\xff\xfe", b"null"])
def test_not_a_json_object_is_invalid(data: bytes) -> None:
    with pytest.raises(InvalidEvent):
        parse_event(data)


@given(st.binary(max_size=300))
def test_any_bytes_are_an_event_or_invalid(data: bytes) -> None:
    try:
        event = parse_event(data)
    except InvalidEvent as exc:
        assert str(exc)
    else:
        assert event.event_type


def test_json_object_decodes_an_object_or_says_why_not() -> None:
    assert json_object(dump(GOOD)) == GOOD
    with pytest.raises(InvalidEvent, match="not JSON"):
        json_object(b"{")
    with pytest.raises(InvalidEvent, match="payload must be a JSON object, got list"):
        json_object(b"[]")
    with pytest.raises(InvalidEvent, match="nested too deeply"):
        json_object(b"[" * 100_000 + b"]" * 100_000)


def test_a_decoded_document_validates_as_its_bytes_do() -> None:
    attributes = {"event_version": "v2"}
    assert event_from_document(GOOD, attributes) == parse_event(dump(GOOD), attributes)
    assert event_from_document(GOOD).to_document() == {**GOOD, "event_direction": "IN",
                                                       "entity_metadata": {**META,
                                                                           "partnerName": ""}}
    with pytest.raises(InvalidEvent, match="event_type is missing"):
        event_from_document({"entity_metadata": META})
