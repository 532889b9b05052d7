"""Every form Google sends is a delivery, through the HTTP endpoint (issue 10).

A CloudEvent whose message has no ``messageId`` and the legacy background
event used to get 400, which Pub/Sub and Eventarc retry until retention ends.
Broker metadata that cannot be used (``deliveryAttempt`` of ``Infinity``) is
ignored, never a 400 or a 503. Only bodies that are not deliveries at all,
including ones nested too deep to parse, get 400.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.model.context import Context
from eventbus.model.router import Router
from tests import golden
from tests.hypothesis_profiles import examples
from tests.service.conftest import ENTRIES, Harness, Make, event


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest) -> str:
    """Every test here runs against both push entries: the Flask app and the ASGI app."""
    return str(request.param)

NEW_FORMS = [
    ("cloudevent_structured_no_message_id.json", "cloudevent", "2070443601311546"),
    ("cloudevent_binary_no_message_id.json", "cloudevent", "2070443601311547"),
    ("background_event.json", "background", "2070443601311548"),
    ("background_event_flat.json", "background", "2070443601311549"),
]


@pytest.mark.parametrize(("name", "form", "message_id"), NEW_FORMS)
def test_new_forms_are_processed_by_the_app(make_harness: Make, name: str, form: str,
                                            message_id: str) -> None:
    h = make_harness(router=None)
    doc = golden.load(name)
    response = h.client.post("/", data=golden.body_bytes(name), headers=doc["headers"])
    assert response.status_code == 200, response.json
    assert response.json["outcome"] == "processed"
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and stored["event_status"] == "SUCCESS"
    assert (stored["pubsub"]["form"], stored["pubsub"]["messageId"]) == (form, message_id)
    assert stored["pubsub"]["publishTime"].startswith("2026-11-22T10:00:0")
    again = h.client.post("/", data=golden.body_bytes(name), headers=doc["headers"])
    assert again.status_code == 200 and again.json["outcome"] == "duplicate"


def test_a_cloudevent_with_no_id_anywhere_is_still_a_400(make_harness: Make) -> None:
    h = make_harness(router=Router())
    name = "cloudevent_binary_no_message_id.json"
    headers = {k: v for k, v in golden.load(name)["headers"].items() if k != "ce-id"}
    response = h.client.post("/", data=golden.body_bytes(name), headers=headers)
    assert response.status_code == 400 and "messageId" in response.json["message"]
    assert h.store.summaries() == []


@pytest.mark.parametrize("body", [
    {"context": {"eventId": "1", "eventType": "google.storage.object.finalize"}, "data": {}},
    {"eventId": "1", "eventType": "providers/cloud.firestore/eventTypes/document.write",
     "data": {"data": "e30="}},
    {"context": {"eventId": "1", "eventType": "google.pubsub.topic.publish"}, "data": "e30="},
])
def test_background_events_of_other_services_are_400(make_harness: Make,
                                                     body: dict[str, Any]) -> None:
    h = make_harness(router=Router())
    response = h.client.post("/", json=body)
    assert response.status_code == 400 and response.json["error"] == "bad_request"


def counting_router() -> tuple[Router, list[Context]]:
    calls: list[Context] = []
    router = Router()
    router.handler("TEST")(calls.append)
    return router, calls


def wrapped(message_id: str, attempt_json: str) -> bytes:
    data = base64.b64encode(json.dumps(event("TEST")).encode()).decode()
    body = json.dumps({"message": {"data": data, "messageId": message_id}, "subscription": "s"})
    return (body[:-1] + ', "deliveryAttempt": ' + attempt_json + "}").encode()


@pytest.mark.parametrize("attempt", ["Infinity", "-Infinity", "NaN", "1e20", "2.5", "-1",
                                     str(2**64), '"many"', "[1]", "true"])
def test_an_unusable_delivery_attempt_is_processed_not_refused(make_harness: Make,
                                                               attempt: str) -> None:
    router, calls = counting_router()
    h = make_harness(router=router)
    response = h.client.post("/", data=wrapped("m-1", attempt),
                             content_type="application/json")
    assert response.status_code == 200 and response.json["outcome"] == "processed"
    assert len(calls) == 1 and calls[0].delivery.delivery_attempt is None
    assert h.store.get(response.json["idempotency_key"])["pubsub"]["deliveryAttempt"] is None


@pytest.mark.parametrize("attempt", ["Infinity", "1e20", "-2", "9" * 30, "2.0"])
def test_an_unusable_delivery_attempt_header_is_ignored(make_harness: Make,
                                                        attempt: str) -> None:
    router, calls = counting_router()
    h = make_harness(router=router)
    response = h.client.post("/", data=json.dumps(event("TEST")), headers={
        "Content-Type": "application/json", "x-goog-pubsub-message-id": "u-1",
        "x-goog-pubsub-delivery-attempt": attempt})
    assert response.status_code == 200 and response.json["outcome"] == "processed"
    assert calls[0].delivery.delivery_attempt is None


# -- hostile metadata in every form, through HTTP ---------------------------------------------

HOSTILE = st.sampled_from(["\ud800", "\x00", "", " ", "é" * 300, "x" * 3000, 2**64, -(2**70),
                           float("inf"), float("nan"), 1e308, -1, True, None, [], {},
                           [[[[[]]]]], {"a": {"b": {}}}]) | st.text(max_size=8)
FIELDS = st.sampled_from(["messageId", "publishTime", "orderingKey", "attributes",
                          "subscription", "deliveryAttempt", "id", "time", "eventId",
                          "timestamp"])
FORMS = st.sampled_from(["wrapped", "structured", "background", "flat"])
IDS = itertools.count()


def envelope(form: str, field: str, value: Any, number: int) -> dict[str, Any]:
    """A delivery of one valid TEST event in ``form``, with ``value`` put into ``field``."""
    data = base64.b64encode(json.dumps(event("TEST", n=number)).encode()).decode()
    message: dict[str, Any] = {"data": data, "messageId": f"m-{number}"}
    if field in ("messageId", "publishTime", "orderingKey", "attributes"):
        message[field] = value
    outer = {field: value} if field in ("subscription", "deliveryAttempt") else {}
    if form == "wrapped":
        return {"message": message, "subscription": "s", **outer}
    if form == "structured":
        top = {field: value} if field in ("id", "time") else {}
        return {"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished",
                "id": f"ce-{number}", **top, "data": {"message": message, **outer}}
    context = {"eventId": f"ev-{number}", "timestamp": "t",
               "eventType": "google.pubsub.topic.publish"}
    if field in ("eventId", "timestamp"):
        context[field] = value
    pubsub = {"@type": "type.googleapis.com/google.pubsub.v1.PubsubMessage", **message}
    return {"context": context, "data": pubsub} if form == "background" \
        else {**context, "data": pubsub}


@pytest.fixture()
def harness(make_harness: Make) -> Harness:
    return make_harness(router=counting_router()[0])


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(form=FORMS, field=FIELDS, value=HOSTILE)
def test_hostile_metadata_in_any_form_is_stored_or_refused(harness: Harness, form: str,
                                                           field: str, value: Any) -> None:
    number = next(IDS)
    body = json.dumps(envelope(form, field, value, number))  # NaN/Infinity as JSON allows
    response = harness.client.post("/", data=body, content_type="application/json")
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.json
    assert response.is_json and "Traceback" not in response.get_data(as_text=True)
    if response.status_code == 200:
        assert harness.store.get(response.json["idempotency_key"]) is not None
