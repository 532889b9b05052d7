"""The push endpoint through Flask's test client, on the in-memory store, with the real handlers.

The MongoDB round-trip budget is in ``test_round_trips_mongo.py`` (it needs the server).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest

from eventbus.correlation import logs
from eventbus.model.context import Context
from eventbus.model.errors import PermanentError, StoreUnavailable
from eventbus.model.forward import is_forward
from eventbus.model.keys import child_key
from eventbus.model.router import Router
from eventbus.store.memory import MemoryEventStore
from tests import golden
from tests.service.conftest import Make, event


class DownStore(MemoryEventStore):
    """A store whose server cannot be reached: every primitive a push uses fails."""

    def _down(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("claim 'k': ServerSelectionTimeoutError: 127.0.0.1:9 refused")

    ensure_indexes = claim = reject = get = succeed = fail = _down  # type: ignore[assignment]


def recording_router(behaviour: Callable[[Context], None] | None = None) -> tuple[Router, list]:
    calls: list[Context] = []
    router = Router()

    @router.handler("TEST")
    def handle(context: Context) -> None:
        calls.append(context)
        if behaviour is not None:
            behaviour(context)

    return router, calls


@pytest.mark.parametrize(("name", "outcome", "status"), [
    ("wrapped_production.json", "processed", "SUCCESS"),
    ("emulator_wrapped_push.json", "processed", "SUCCESS"),
    ("wrapped_no_attributes.json", "processed", "SUCCESS"),
    ("wrapped_v1_order.json", "processed", "SUCCESS"),
    ("cloudevent_structured.json", "processed", "SUCCESS"),
    ("cloudevent_binary.json", "processed", "SUCCESS"),
    ("unwrapped_with_metadata.json", "processed", "SUCCESS"),
    ("bad_json_payload.json", "rejected", "FAILED"),
    ("unknown_event_type.json", "rejected", "FAILED"),
])
def test_golden_payloads(make_harness: Make, name: str, outcome: str, status: str) -> None:
    h = make_harness(router=None)
    doc = golden.load(name)
    response = h.client.post("/", data=golden.body_bytes(name), headers=doc["headers"])
    assert response.status_code == 200, response.json
    assert response.json["outcome"] == outcome
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and stored["event_status"] == status
    if status == "FAILED":
        assert stored["retryable"] is False and stored["error"]["message"]


def test_order_event_updates_the_projection_and_emits_a_partner_notification(
        make_harness: Make) -> None:
    h = make_harness()
    name = "wrapped_production.json"
    keys = set()
    for _ in range(3):  # redeliveries of the same message
        response = h.client.post("/", data=golden.body_bytes(name),
                                 headers=golden.load(name)["headers"])
        assert response.status_code == 200
        keys.add(response.json["idempotency_key"])
    db = h.db
    order = db.order_projection.find_one({"_id": "6231cfc8800d284c981b3146:59734"})
    assert order["status"] == "OR_CNF" and order["eventsApplied"] == 1
    # The notification is the next step of the cascade: one outbox entry, not yet sent.
    (key,) = keys
    (entry,) = [e for e in h.store.get(key)["outbox"] if not is_forward(e)]
    assert entry["idempotency_key"] == child_key(key, "PARTNER_NOTIFY", 0)
    assert (entry["event_type"], entry["event_direction"], entry["status"]) == \
        ("PARTNER_NOTIFY", "OUT", "PENDING")
    assert entry["entity_data"] == {"kind": "order-status", "payload": {
        "orderId": 59734, "status": "OR_CNF", "asOf": order["asOf"]}}
    assert (entry["parent_key"], entry["root_key"]) == (key, key)
    assert db.partner_notifications.count_documents({}) == 0


def test_v1_order_is_upcast_before_the_handler(make_harness: Make) -> None:
    h = make_harness()
    name = "wrapped_v1_order.json"
    h.client.post("/", data=golden.body_bytes(name), headers=golden.load(name)["headers"])
    order = h.db.order_projection.find_one({"orderId": 777})
    assert order["status"] == "OR_PLC" and order["lineItems"][0]["sku"] == "SKU-9"


def test_duplicate_is_acked_without_running_the_handler(make_harness: Make) -> None:
    router, calls = recording_router()
    h = make_harness(router=router)
    first, second = h.push(event(), "m-1"), h.push(event(), "m-2")
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json["outcome"] == "duplicate" and len(calls) == 1


def test_transient_failure_is_retried_and_counted(make_harness: Make) -> None:
    def flaky(context: Context) -> None:
        if context.attempt == 1:
            raise ConnectionError("partner API down")

    router, calls = recording_router(flaky)
    h = make_harness(router=router)
    first = h.push(event())
    assert first.status_code == 503 and first.json["outcome"] == "retry"
    failed = h.store.get(first.json["idempotency_key"])
    assert failed["event_status"] == "FAILED" and failed["retryable"] is True
    assert "partner API down" in failed["error"]["message"]
    h.clock.advance(10)
    second = h.push(event())
    assert second.status_code == 200 and second.json["outcome"] == "processed"
    stored = h.store.get(second.json["idempotency_key"])
    assert stored["event_status"] == "SUCCESS"
    assert sorted(stored["entity_metadata"]["resilienceAttemptCount"]) == ["1", "2"]
    assert [c.attempt for c in calls] == [1, 2]


def test_permanent_failure_is_stored_and_acked_once(make_harness: Make) -> None:
    def broken(context: Context) -> None:
        raise PermanentError("partner rejected the order")

    router, calls = recording_router(broken)
    h = make_harness(router=router)
    first, again = h.push(event()), h.push(event())
    assert first.status_code == 200 and first.json["outcome"] == "rejected"
    assert again.status_code == 200 and again.json["outcome"] == "duplicate"
    stored = h.store.get(first.json["idempotency_key"])
    assert stored["retryable"] is False and stored["error"]["classification"] == "permanent"
    assert len(calls) == 1


def test_live_lease_gets_503_and_an_expired_one_is_taken(make_harness: Make) -> None:
    router, calls = recording_router()
    h = make_harness(router=router, lease_seconds=30)
    key = "p:p1:lease-test"  # the publisher's key "lease-test", scoped by its partner
    h.store.claim(key, {"event_type": "TEST"}, h.clock())
    busy = h.push(event(), idempotency_key="lease-test")
    assert busy.status_code == 503 and busy.json["outcome"] == "in_progress"
    assert busy.json["idempotency_key"] == key
    h.clock.advance(31)
    taken = h.push(event(), idempotency_key="lease-test")
    assert taken.status_code == 200 and taken.json["attempt"] == 2 and len(calls) == 1


def test_attempt_cap_stores_failed_for_good_and_acks(make_harness: Make) -> None:
    def always(context: Context) -> None:
        raise TimeoutError("still down")

    router, _ = recording_router(always)
    h = make_harness(router=router, max_attempts=2)
    assert h.push(event()).status_code == 503
    last = h.push(event())
    assert last.status_code == 200 and last.json["outcome"] == "rejected"
    stored = h.store.get(last.json["idempotency_key"])
    assert stored["error"]["classification"] == "attempt_cap" and stored["retryable"] is False


@pytest.mark.parametrize("body", [b"", b"hello", b"[]", b'{"message": {}}', b'{"a": 1}'])
def test_not_a_pubsub_delivery_is_400_json(make_harness: Make, body: bytes) -> None:
    h = make_harness(router=Router())
    response = h.client.post("/", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.json["error"] == "bad_request" and response.json["message"]
    assert h.store.summaries() == []


def test_too_large_is_413(make_harness: Make) -> None:
    h = make_harness(router=Router(), max_body_bytes=1000)
    response = h.client.post("/", data=b"x" * 2000, content_type="application/json")
    assert response.status_code == 413 and response.json["error"] == "payload_too_large"


@pytest.mark.parametrize("declared", ["\u00b2", "9" * 5000, "-5", "1e9", " 12"])
def test_a_hostile_content_length_is_never_a_500(make_harness: Make, declared: str) -> None:
    # "²" passes str.isdigit() and 5,000 digits exceed int()'s limit: neither may reach int().
    h = make_harness(router=Router(), max_body_bytes=1000)
    response = h.client.post("/", data=b'{"a": 1}', content_type="application/json",
                             environ_overrides={"CONTENT_LENGTH": declared})
    assert 400 <= response.status_code < 500, response.json
    assert h.store.summaries() == []


def test_health_and_unknown_routes_answer_json(make_harness: Make) -> None:
    h = make_harness(router=Router())
    assert h.client.get("/health").json == {"status": "ok"}
    assert h.client.get("/ready").status_code == 200
    assert h.client.get("/").status_code == 405
    missing = h.client.get("/nope")
    assert missing.status_code == 404 and missing.json["error"] == "not_found"


def test_store_down_is_503_without_a_traceback(make_harness: Make) -> None:
    router, calls = recording_router()
    h = make_harness(router=router, store=DownStore())
    response = h.push(event())
    assert response.status_code == 503 and response.json["outcome"] == "unavailable"
    assert "Traceback" not in response.get_data(as_text=True) and calls == []


def test_one_structured_log_line_per_request(make_harness: Make) -> None:
    router, _ = recording_router()
    h = make_harness(router=router)
    stream = io.StringIO()
    logs.configure("svc", stream=stream)
    h.push(event(), idempotency_key="log-1")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    request_lines = [line for line in lines if line.get("logType") == "REQUEST_INBOUND"]
    assert len(request_lines) == 1
    line: dict[str, Any] = request_lines[0]
    assert line["severity"] == "INFO" and line["status"] == 200 and line["service"] == "svc"
    for field in ("method", "path", "requestId", "duration", "timestamp", "outcome"):
        assert field in line


def test_a_corrected_event_under_a_refused_key_is_processed_not_swallowed(
        make_harness: Make) -> None:
    # A publisher sends a typo in event_type, is told "rejected", fixes it and
    # publishes again under the same key, as the README tells it to.
    router, calls = recording_router()
    h = make_harness(router=router)
    typo = h.push(event("TSET", n=1), "m-1", idempotency_key="k-1")
    fixed = h.push(event("TEST", n=1), "m-2", idempotency_key="k-1")
    again = [h.push(event("TEST", n=1), "m-3", idempotency_key="k-1"),
             h.push(event("TSET", n=1), "m-1", idempotency_key="k-1")]  # redeliveries
    assert typo.json["outcome"] == "rejected" and fixed.json["outcome"] == "processed"
    assert [r.json["outcome"] for r in again] == ["duplicate", "duplicate"]
    assert len(calls) == 1 and typo.json["idempotency_key"] == fixed.json["idempotency_key"]
    record = h.store.get(fixed.json["idempotency_key"]) or {}
    assert (record["event_status"], record["event_type"]) == ("SUCCESS", "TEST")
    [refused] = record["rejections"]
    assert refused["event_type"] == "TSET" and '"TSET"' in refused["raw_payload"]
