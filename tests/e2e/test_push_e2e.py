"""Publish to the real emulator, which pushes to the real gunicorn service; check MongoDB.

One database for the module; each test starts its own ``main:app`` service
(with the fault handlers loaded) and its own push route with a 1 s minimum
backoff. The emulator holds at most two pushes in flight, so every test
publishes only a handful of messages.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from eventbus.model.event import parse_event
from eventbus.model.keys import record_key
from eventbus.pubsub.message import build_event, build_message
from tests.e2e import support
from tests.e2e.harness import PushRoute, ServiceProcess, wait_until


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_push")


@pytest.fixture
def svc(
    service: Callable[..., ServiceProcess], emulator: str, mongo_uri: str, db: Database
) -> ServiceProcess:
    return service(env=support.service_env(mongo_uri, db.name, emulator))


@pytest.fixture
def route(push_route: Callable[..., PushRoute], emulator: str, svc: ServiceProcess) -> PushRoute:
    return push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)


def tag() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def test_order_event_is_stored_success_and_projected(route: PushRoute, db: Database) -> None:
    order_id = int(uuid.uuid4().int % 10**8)
    partner = "6231cfc8800d284c981b3146"
    event = build_event(
        "OR_MGMT",
        {
            "orderId": order_id,
            "orderStatusLatest": "OR_CNF",
            "orderStatusLatestTimestamp": 1655292804,
            "orderLineItems": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 19.99}],
            "orderSummary": {"total": 39.98, "currency": "EUR"},
        },
        entity={"partnerId": partner, "partnerName": "ExamplePartner",
                "entity_id": f"order-{order_id}", "entity_type": "Order"},
        version="v2",
    )  # fmt: skip
    data, attributes = build_message(event, key=f"order-{order_id}:OR_CNF:1655292804")
    message_id = route.publish(data, **attributes)
    key = record_key(event, attributes)
    assert key == f"p:{partner}:order-{order_id}:OR_CNF:1655292804"  # scoped by partner

    record = support.wait_for_status(db, key, "SUCCESS")

    assert record["event_type"] == "OR_MGMT" and record["event_version"] == "v2"
    assert record["event_direction"] == "IN"
    meta = record["entity_metadata"]
    assert (meta["partnerId"], meta["partnerName"]) == (partner, "ExamplePartner")
    assert (meta["entity_id"], meta["entity_type"]) == (f"order-{order_id}", "Order")
    assert list(meta["resilienceAttemptCount"]) == ["1"]
    assert record["entity_data"]["orderId"] == order_id
    assert record["created"].isdigit() and record["lastUpdatedTime"].isdigit()
    assert record["event_day_id"] == int(record["created"]) // 86_400_000
    assert "lease_until" not in record and "lease_owner" not in record
    assert record["createdBy"] == "partner-eventbus" and record["attempts"] == 1
    assert record["pubsub"]["messageId"] == message_id
    assert record["pubsub"]["subscription"] == route.subscription_path
    projection = db.order_projection.find_one({"_id": f"{partner}:{order_id}"})
    assert projection is not None
    assert (projection["status"], projection["statusName"]) == ("OR_CNF", "confirmed")
    assert projection["eventsApplied"] == 1
    assert projection["updatedBy"] == key


def test_transient_failure_heals_on_redelivery(
    route: PushRoute, svc: ServiceProcess, db: Database
) -> None:
    name = tag()
    payload = support.event("TEST_FLAKY", tag=name, fail_times=1)
    route.publish(support.encode(payload), idempotency_key=name)
    key = support.stored_key(payload, {"idempotency_key": name})

    record = support.wait_for_status(db, key, "SUCCESS", timeout=30)

    assert len(record["entity_metadata"]["resilienceAttemptCount"]) >= 2
    assert record["attempts"] >= 2
    assert "error" not in record and "retryable" not in record
    assert support.effect_runs(db, name) == 1
    lines = support.wait_for_outcome(svc, key, "processed")
    assert (lines[0]["status"], lines[0]["outcome"]) == (503, "retry")
    assert (lines[-1]["status"], lines[-1]["outcome"]) == (200, "processed")


def test_permanent_failure_is_stored_acked_and_not_redelivered(
    route: PushRoute, svc: ServiceProcess, db: Database
) -> None:
    name = tag()
    payload = support.event("TEST_PERMANENT", tag=name)
    route.publish(support.encode(payload), idempotency_key=name)
    key = support.stored_key(payload, {"idempotency_key": name})

    record = support.wait_for_status(db, key, "FAILED", timeout=30)
    assert record["retryable"] is False
    assert record["error"]["classification"] == "permanent"
    assert record["error"]["type"] == "PermanentError" and record["attempts"] == 1
    # A nacked push comes back about 1 s later (min_backoff=1); give it three.
    time.sleep(3)
    assert support.effect_runs(db, name) == 1
    lines = support.request_lines(svc, key)
    assert [(line["status"], line["outcome"]) for line in lines] == [(200, "rejected")]
    assert support.record_of(db, key) == record  # unchanged: no attempt after the first


@pytest.mark.parametrize("keyed", [False, True], ids=["content-hash-key", "idempotency_key"])
def test_same_event_published_twice_has_its_effect_once(
    route: PushRoute, svc: ServiceProcess, db: Database, keyed: bool
) -> None:
    name = tag()
    data = support.encode(support.event("TEST_EFFECT", tag=name, sleep=0.05))
    attributes = {"idempotency_key": f"k-{name}"} if keyed else {}
    first = route.publish(data, **attributes)
    second = route.publish(data, **attributes)
    assert first != second  # two messages for Pub/Sub, one event for us

    key = record_key(parse_event(data, attributes), attributes)

    def both_acked() -> list[dict[str, object]] | None:
        lines = support.request_lines(svc, key)
        return lines if sum(line["status"] == 200 for line in lines) >= 2 else None

    lines = wait_until(both_acked, timeout=30, message=f"both publishes of {key} acked")
    acked = sorted(str(line["outcome"]) for line in lines if line["status"] == 200)
    assert acked == ["duplicate", "processed"]
    # Both may be in flight at once: the second then waits out the first's lease.
    assert {line["outcome"] for line in lines if line["status"] != 200} <= {"in_progress"}
    assert support.effect_runs(db, name) == 1
    record = support.record_of(db, key)
    assert record is not None and record["event_status"] == "SUCCESS" and record["attempts"] == 1
