import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus.model.delivery import Delivery
from eventbus.model.errors import RequestError
from eventbus.pubsub.envelope import parse_delivery
from tests import golden

WRAPPED = {"message": {"data": base64.b64encode(b'{"a": 1}').decode(), "messageId": "1"},
           "subscription": "projects/p/subscriptions/s"}


def parse(body: object, headers: dict[str, str] | None = None) -> Delivery:
    return parse_delivery(json.dumps(body).encode(), headers or {})


def test_production_form_keeps_every_field() -> None:
    doc = golden.load("wrapped_production.json")
    delivery = parse_delivery(golden.body_bytes("wrapped_production.json"), doc["headers"])
    assert delivery.form == "wrapped"
    assert delivery.message_id == "2070443601311540"
    assert delivery.delivery_attempt == 2
    assert delivery.ordering_key == "order-12345"
    assert delivery.attributes["idempotency_key"] == "order-12345:OR_CNF:1655292804"
    assert json.loads(delivery.data)["event_type"] == "OR_MGMT"


def test_missing_attributes_and_emulator_empty_attributes_are_the_same() -> None:
    without = parse(WRAPPED)
    emulator = parse({**WRAPPED, "message": {**WRAPPED["message"], "attributes": {}}})
    assert without.attributes == emulator.attributes == {}
    assert without.delivery_attempt is None


@pytest.mark.parametrize("name", ["cloudevent_structured.json", "cloudevent_binary.json"])
def test_cloudevents_carry_the_same_message(name: str) -> None:
    doc = golden.load(name)
    delivery = parse_delivery(golden.body_bytes(name), doc["headers"])
    assert delivery.form == "cloudevent"
    assert json.loads(delivery.data)["entity_metadata"]["entity_id"] == "order-12345"


def test_unwrapped_reads_metadata_and_known_attributes_from_headers() -> None:
    doc = golden.load("unwrapped_with_metadata.json")
    delivery = parse_delivery(golden.body_bytes("unwrapped_with_metadata.json"), doc["headers"])
    assert delivery.form == "unwrapped"
    assert delivery.message_id == "2070443601311545"
    assert delivery.attributes == {"idempotency_key": "unwrapped-1"}
    assert delivery.ordering_key == "order-12345"


def test_bad_base64_is_a_delivery_with_a_decode_error() -> None:
    delivery = parse({"message": {"data": "!!!", "messageId": "9"}, "subscription": "s"})
    assert delivery.decode_error == "message.data is not valid base64"


@pytest.mark.parametrize("body", [
    [], "text", {"hello": "world"}, {"message": "x"}, {"message": {"data": "e30="}},
    {"message": {"messageId": 5}}, {"message": {"messageId": "1", "attributes": {"a": 1}}},
    {"message": {"messageId": "1"}, "deliveryAttempt": "many"},
    {"specversion": "1.0", "type": "com.example.other", "data": {}},
])
def test_not_a_delivery_is_a_request_error(body: object) -> None:
    with pytest.raises(RequestError):
        parse(body)


def test_non_json_without_pubsub_headers_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="not JSON"):
        parse_delivery(b"\xff\x00garbage", {})


def test_unknown_cloudevent_type_in_headers_is_rejected() -> None:
    with pytest.raises(RequestError, match="unsupported CloudEvent"):
        parse_delivery(b"{}", {"ce-type": "google.cloud.storage.object.v1.finalized"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
       st.dictionaries(st.sampled_from(["ce-type", "x-goog-pubsub-message-id", "other"]),
                       st.text(max_size=20), max_size=2))
def test_any_body_is_a_delivery_or_a_request_error(body: bytes, headers: dict[str, str]) -> None:
    try:
        delivery = parse_delivery(body, headers)
    except RequestError as exc:
        assert exc.status == 400 and str(exc)
    else:
        assert isinstance(delivery.data, bytes)
