import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus.model.delivery import Delivery
from eventbus.model.errors import RequestError
from eventbus.pubsub.envelope import parse_delivery
from tests import golden
from tests.hypothesis_profiles import examples

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
    {"eventType": "google.storage.object.finalize", "eventId": "1", "data": {}},
    {"context": {"eventType": "google.pubsub.topic.publish", "eventId": "1"}, "data": "e30="},
    {"context": {"eventType": "google.pubsub.topic.publish", "eventId": "1"},
     "data": {"@type": "type.googleapis.com/google.storage.v1.StorageObject"}},
    {"context": {"eventType": "google.pubsub.topic.publish"}, "data": {"data": "e30="}},
    {"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished",
     "data": {"message": {"data": "e30="}}},
    {"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished", "id": 7,
     "data": {"message": {"data": "e30="}}},
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


@settings(max_examples=examples(300), deadline=None)
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


# -- forms whose message id comes from the wrapper (issue 10) --------------------------------

@pytest.mark.parametrize(("name", "form", "message_id", "publish_time"), [
    ("cloudevent_structured_no_message_id.json", "cloudevent", "2070443601311546",
     "2026-11-22T10:00:06.000Z"),
    ("cloudevent_binary_no_message_id.json", "cloudevent", "2070443601311547",
     "2026-11-22T10:00:07.000Z"),
    ("background_event.json", "background", "2070443601311548", "2026-11-22T10:00:08.000Z"),
    ("background_event_flat.json", "background", "2070443601311549",
     "2026-11-22T10:00:09.000Z"),
])
def test_the_wrapper_id_and_time_stand_in_for_a_missing_message_id(
        name: str, form: str, message_id: str, publish_time: str) -> None:
    doc = golden.load(name)
    delivery = parse_delivery(golden.body_bytes(name), doc["headers"])
    assert (delivery.form, delivery.message_id, delivery.publish_time) == \
        (form, message_id, publish_time)
    assert json.loads(delivery.data)["entity_metadata"]["entity_id"] == "order-12345"
    assert delivery.decode_error is None and delivery.delivery_attempt is None


def test_the_message_own_id_wins_over_the_cloudevent_id() -> None:
    doc = golden.load("cloudevent_structured.json")
    body = {**doc["body"], "id": "other", "time": "1999-01-01T00:00:00Z"}
    delivery = parse(body, doc["headers"])
    assert delivery.message_id == "2070443601311543"
    assert delivery.publish_time == "2026-11-22T10:00:03.000Z"


def test_a_background_event_keeps_attributes_and_a_message_id_in_its_data() -> None:
    body = golden.load("background_event.json")["body"]
    body["data"] = {**body["data"], "messageId": "own-id", "attributes": {"idempotency_key": "k"}}
    delivery = parse(body)
    assert (delivery.message_id, delivery.attributes) == ("own-id", {"idempotency_key": "k"})


def test_a_background_event_with_bad_base64_is_a_delivery_with_a_decode_error() -> None:
    body = golden.load("background_event.json")["body"]
    body["data"] = {**body["data"], "data": "!!!"}
    assert parse(body).decode_error == "message.data is not valid base64"


def test_an_envelope_nested_100000_deep_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="nested too deeply"):
        parse_delivery(b"[" * 100_000 + b"]" * 100_000, {})
    with pytest.raises(RequestError, match="nested too deeply"):
        parse_delivery(b'{"message":' * 100_000 + b"1" + b"}" * 100_000, {})
    with pytest.raises(RequestError, match="nested too deeply"):
        parse_delivery(b"[" * 100_000 + b"]" * 100_000,
                       {"ce-type": "google.cloud.pubsub.topic.v1.messagePublished"})


# -- deliveryAttempt is broker metadata: unusable values are ignored, never a 400 ------------

@pytest.mark.parametrize("raw", [
    "Infinity", "-Infinity", "NaN", "1e20", "2.5", "3.0", "-1", "2147483648", "1e400",
    "true", "false", '"many"', '"3"', '""', "[]", "{}", str(2**64), str(-(2**70)),
])
def test_an_unusable_delivery_attempt_is_ignored(raw: str) -> None:
    body = json.dumps(WRAPPED)[:-1] + ', "deliveryAttempt": ' + raw + "}"
    delivery = parse_delivery(body.encode(), {})
    assert delivery.delivery_attempt == (3 if raw == '"3"' else None)
    assert delivery.message_id == "1"


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (1, 1), (2**31 - 1, 2**31 - 1), (2**31, None), (-1, None), (True, None),
    (None, None), (5.0, None)])
def test_a_delivery_attempt_must_be_a_whole_int32(value: object, expected: int | None) -> None:
    assert parse({**WRAPPED, "deliveryAttempt": value}).delivery_attempt == expected


@pytest.mark.parametrize(("header", "expected"), [
    ("4", 4), (" 4 ", 4), ("Infinity", None), ("1e20", None), ("NaN", None), ("-3", None),
    ("2.0", None), ("99999999999999999999", None), ("٣", None), ("", None), ("0x10", None)])
def test_the_delivery_attempt_header_is_read_or_ignored(header: str,
                                                        expected: int | None) -> None:
    delivery = parse_delivery(b'{"event_type": "X"}', {
        "x-goog-pubsub-message-id": "9", "x-goog-pubsub-delivery-attempt": header})
    assert delivery.delivery_attempt == expected


# -- hostile values in every envelope field -------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["\ud800", "\udfff", "\x00", "a\x00b", "", " ", "é" * 300,
                                "\u202e", "x" * 5000]) | st.text(max_size=10)
hostile = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**200), 2**200) | st.floats() | HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
    max_leaves=8)


def envelopes(value: object) -> list[dict[str, object]]:
    """Every form, with ``value`` in each of its fields in turn."""
    message = {"data": "e30=", "messageId": "1"}
    context = {"eventId": "1", "timestamp": "t", "eventType": "google.pubsub.topic.publish"}
    structured = {"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished",
                  "id": "1", "time": "t", "data": {"message": {"data": "e30="}}}
    forms: list[dict[str, object]] = []
    for field in ("data", "messageId", "publishTime", "attributes", "orderingKey"):
        forms.append({"message": {**message, field: value}, "subscription": "s"})
        forms.append({"context": context,
                      "data": {"@type": "type.googleapis.com/google.pubsub.v1.PubsubMessage",
                               **message, field: value}})
    for field in ("subscription", "deliveryAttempt", "message"):
        forms.append({"message": message, "subscription": "s", field: value})
    for field in ("eventId", "timestamp", "eventType", "resource"):
        forms.append({"context": {**context, field: value}, "data": {"data": "e30="}})
        forms.append({**context, field: value, "data": {"data": "e30="}})
    forms.append({"context": context, "data": value})
    for field in ("id", "time", "type", "data"):
        forms.append({**structured, field: value})
    return forms


def dumps(document: object, ascii_only: bool) -> bytes:
    """JSON bytes, either escaped or raw UTF-8 with surrogates passed through."""
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@settings(max_examples=examples(200), deadline=None)
@given(hostile, st.booleans())
def test_hostile_values_in_any_field_give_a_delivery_or_a_request_error(
        value: object, ascii_only: bool) -> None:
    for document in envelopes(value):
        try:
            delivery = parse_delivery(dumps(document, ascii_only), {})
        except RequestError as exc:
            assert exc.status == 400 and len(str(exc)) < 400
        else:
            assert delivery.message_id and isinstance(delivery.data, bytes)
            attempt = delivery.delivery_attempt
            assert attempt is None or 0 <= attempt <= 2**31 - 1


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":', '{"message":', '{"data":']))
def test_any_nesting_depth_gives_a_delivery_or_a_request_error(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    body = (opener * depth + ("" if opener == "[" else "1") + closer * depth).encode()
    try:
        parse_delivery(body, {})
    except RequestError as exc:
        assert exc.status == 400
