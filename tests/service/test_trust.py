"""Issue 10's trust cases through the real app on the in-memory store.

Each case was reproduced against the real server before the fix; the inputs
are the issue's. Every delivery ends as a 400 or a stored record with an ack;
no key can be taken across partners, payloads or cascades.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.keys import child_key, rejected_key
from eventbus.model.router import Router
from eventbus.outbox.relay import Relay
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock
from handlers.notifications import NOTIFY
from tests.service.conftest import ENTRIES, START, Harness, Make, event, memory_database


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest) -> str:
    """Every test here runs against both push entries: the Flask app and the ASGI app."""
    return str(request.param)


def counting_router(*internal: str) -> tuple[Router, list[str]]:
    """A router whose ``PARENT`` emits a ``CHILD``; every run is recorded."""
    router, runs = Router(), []

    @router.handler("PARENT")
    def parent(context: Context) -> None:
        runs.append(context.key)
        context.emit("CHILD", {"n": context.event.entity_data.get("n", 0)})

    def child(context: Context) -> None:
        runs.append(context.key)

    router.handler("CHILD", internal="CHILD" in internal)(child)
    router.handler("TEST")(lambda context: runs.append(context.key))
    return router, runs


def push_raw(h: Harness, data: bytes, message_id: str, **attributes: str) -> Any:
    body = {"message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                        "attributes": attributes}, "subscription": "projects/p/subscriptions/s"}
    return h.client.post("/", json=body)


def relayed(h: Harness, publisher: CapturingPublisher) -> list[Any]:
    """Deliver what the relay published, as Pub/Sub would push it."""
    return [push_raw(h, m.data, m.message_id, **m.attributes) for m in publisher.take()]


def cascade(make_harness: Make, *internal: str) -> tuple[Harness, CapturingPublisher, list[str]]:
    """A harness whose relay publishes children to a capturing publisher."""
    router, runs = counting_router(*internal)
    publisher, clock = CapturingPublisher(), FakeClock(START)
    store = MemoryEventStore(lease=dt.timedelta(seconds=30), database=memory_database())
    relay = Relay(store, publisher, now=clock)
    return make_harness(router=router, store=store, clock=clock, after_success=relay), \
        publisher, runs


# -- every message ends stored ------------------------------------------------------------------

def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    "int-past-64-bits": {"n": 2**63},
    "negative-int-past-64-bits": {"n": -(2**63) - 1},
    "nul-in-a-key": {"a\u0000b": 1},
    "lone-surrogate-value": {"s": "\ud800"},
    "lone-surrogate-key": {"\udfff": 1},
    "nested-500": {"d": nested(500)},
    "nested-49": {"d": nested(49)},
}
HUGE = {"array-of-3-million-zeros": {"z": [0] * 3_000_000}}
"""A 9 MB body: about 3 s of CPU per entry (json, base64, the content walk, the store, twice),
the longest test of make check, so a test of its own marked slow: make test runs it."""


def assert_stored_failed_for_good_and_acked(h: Harness, payloads: dict[str, Any],
                                            republish: bool = True) -> None:
    for number, (name, data) in enumerate(payloads.items()):
        raw = json.dumps(event("TEST", **data)).encode()
        first = push_raw(h, raw, f"m-{number}")
        assert first.status_code == 200, (name, first.json)
        assert first.json["outcome"] == "rejected", name
        key = first.json["idempotency_key"]
        assert key == rejected_key(raw, {})
        stored = h.store.get(key)
        assert stored is not None and stored["event_status"] == "FAILED", name
        assert stored["retryable"] is False and stored["error"]["classification"] == "invalid"
        assert stored["payload_size"] == len(raw) and len(stored["payload_sha256"]) == 64
        assert len(stored["raw_payload"]) <= 16 * 1024
        assert stored["delivery_count"] == 1
        again = push_raw(h, raw, f"m-{number}")
        assert (again.status_code, again.json["outcome"]) == (200, "duplicate"), name
        if not republish:
            continue
        # Published again (another message id): the same record, one delivery more.
        republished = push_raw(h, raw, f"m-{number}-again")
        assert (republished.status_code, republished.json["outcome"]) == (200, "duplicate")
        assert republished.json["idempotency_key"] == key
        after = h.store.get(key)
        assert after is not None and after["delivery_count"] == 3, name
        assert {**after, "delivery_count": 1} == stored, name


def test_each_hostile_payload_is_stored_failed_for_good_and_acked(make_harness: Make) -> None:
    assert_stored_failed_for_good_and_acked(make_harness(router=counting_router()[0]), HOSTILE)


@pytest.mark.slow
def test_a_huge_payload_is_stored_failed_for_good_and_acked(make_harness: Make) -> None:
    # Not published a third time: each push of it costs seconds (the quick tier's cases do).
    assert_stored_failed_for_good_and_acked(make_harness(router=counting_router()[0]), HUGE,
                                            republish=False)


def test_a_surrogate_in_the_partner_message_id_or_key_attribute_is_stored(
        make_harness: Make) -> None:
    h = make_harness(router=counting_router()[0])
    cases = [(event("TEST") | {"entity_metadata": {**event()["entity_metadata"],
                                                   "partnerId": "\ud800"}}, "m-a", {}),
             (event("TEST"), "\ud800", {}),
             (event("TEST"), "m-c", {"idempotency_key": "\ud800"}),
             (b"not json \xff", "\udfff", {"idempotency_key": "\ud800"})]
    for payload, message_id, attributes in cases:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        response = push_raw(h, raw, message_id, **attributes)
        assert response.status_code == 200 and response.json["outcome"] == "rejected"
        assert h.store.get(response.json["idempotency_key"]) is not None


def test_an_unknown_type_with_9_mb_of_data_is_stored_once_and_bounded(
        make_harness: Make) -> None:
    h = make_harness(router=counting_router()[0])
    raw = json.dumps(event("NOBODY_HANDLES_THIS", blob="x" * 9_000_000)).encode()
    response = push_raw(h, raw, "m-big")
    assert response.json["outcome"] == "rejected"
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and stored["entity_data"] == {}
    assert stored["payload_size"] == len(raw) and len(stored["raw_payload"]) <= 16 * 1024


def test_six_megabytes_of_0xff_are_stored_bounded(make_harness: Make) -> None:
    h = make_harness(router=counting_router()[0])
    response = push_raw(h, b"\xff" * 6_000_000, "m-ff")
    assert response.status_code == 200 and response.json["outcome"] == "rejected"
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and len(stored["raw_payload"]) <= 16 * 1024
    assert stored["raw_payload"].startswith("\\xff\\xff")


# -- a key space publishers cannot hijack ----------------------------------------------------

def test_a_second_payload_under_a_taken_key_is_a_recorded_conflict(make_harness: Make) -> None:
    router, runs = counting_router()
    h = make_harness(router=router)
    first = h.push(event("TEST", n=1), "m-1", idempotency_key="k")
    second = h.push(event("TEST", n=2), "m-2", idempotency_key="k")
    assert first.json["outcome"] == "processed" and len(runs) == 1
    assert (second.status_code, second.json["outcome"]) == (200, "conflict")
    original = h.store.get(first.json["idempotency_key"])
    assert original is not None and original["entity_data"] == {"n": 1}
    conflicts = [doc for doc in h.store.summaries() if doc["idempotency_key"].startswith(
        "conflict:")]
    assert len(conflicts) == 1
    recorded = h.store.get(conflicts[0]["idempotency_key"])
    assert recorded is not None and recorded["conflicts_with"] == first.json["idempotency_key"]
    assert recorded["entity_data"] == {"n": 2} and recorded["error"]["classification"] == \
        "conflict"
    # The same second payload again is still only that one conflict record.
    assert h.push(event("TEST", n=2), "m-2", idempotency_key="k").json["outcome"] == "conflict"
    assert len([d for d in h.store.summaries() if d["idempotency_key"].startswith("conf")]) == 1


def test_one_partner_cannot_take_another_partners_key(make_harness: Make) -> None:
    router, runs = counting_router()
    h = make_harness(router=router)
    victim = h.push(event("TEST", n=1), "m-1", idempotency_key="order-1")
    attacker_event = event("TEST", n=1)
    attacker_event["entity_metadata"] = {**attacker_event["entity_metadata"],
                                         "partnerId": "attacker"}
    attacker = h.push(attacker_event, "m-2", idempotency_key="order-1")
    assert victim.json["outcome"] == attacker.json["outcome"] == "processed"
    assert victim.json["idempotency_key"] != attacker.json["idempotency_key"]
    assert len(runs) == 2


def test_a_publisher_cannot_send_a_child_shaped_or_invalid_key(make_harness: Make) -> None:
    h = make_harness(router=counting_router()[0])
    child_shaped = h.push(event("TEST"), "m-1", idempotency_key="p:p1:k/0:CHILD")
    assert child_shaped.json["outcome"] == "rejected"
    assert child_shaped.json["idempotency_key"].startswith("invalid:")
    squat = h.push(event("TEST"), "m-2", idempotency_key="invalid:abc")
    assert squat.json["outcome"] == "processed"
    assert squat.json["idempotency_key"] == "p:p1:invalid:abc"
    # The broken message whose invalid: key that was keeps its raw payload.
    broken = push_raw(h, b"{broken", "m-3")
    stored = h.store.get(broken.json["idempotency_key"])
    assert stored is not None and stored["raw_payload"] == "{broken"


def test_garbage_under_a_predictable_child_key_does_not_take_the_real_child(
        make_harness: Make) -> None:
    h, publisher, runs = cascade(make_harness)
    parent = h.push(event("PARENT", n=1), "m-1", idempotency_key="order")
    parent_key = parent.json["idempotency_key"]
    real_child = child_key(parent_key, "CHILD", 0)
    forged = h.push(event("CHILD", n=666), "m-x", idempotency_key=real_child,
                    parent_key=parent_key, root_key=parent_key)
    assert forged.json["outcome"] == "rejected"
    assert forged.json["idempotency_key"].startswith("invalid:")
    [child] = relayed(h, publisher)
    assert (child.json["outcome"], child.json["idempotency_key"]) == ("processed", real_child)
    assert runs == [parent_key, real_child]
    stored = h.store.get(real_child)
    assert stored is not None and stored["entity_data"] == {"n": 1}


def test_a_forged_root_key_cannot_graft_an_event_onto_a_cascade(make_harness: Make) -> None:
    h, publisher, _ = cascade(make_harness)
    parent = h.push(event("PARENT", n=1), "m-1", idempotency_key="order")
    relayed(h, publisher)
    grafted = h.push(event("TEST"), "m-2", idempotency_key="graft",
                     parent_key="p:p1:elsewhere", root_key=parent.json["idempotency_key"])
    assert grafted.json["outcome"] == "rejected"
    tree = [doc["idempotency_key"] for doc in h.store.summaries({parent.json["idempotency_key"]})]
    assert len(tree) == 2 and grafted.json["idempotency_key"] not in tree


def test_an_internal_step_sent_from_outside_is_refused(make_harness: Make) -> None:
    h, publisher, runs = cascade(make_harness, "CHILD")
    outside = h.push(event("CHILD", refund=9999), "m-1", idempotency_key="mine")
    assert outside.json["outcome"] == "rejected" and runs == []
    assert outside.json["idempotency_key"].startswith("invalid:")
    h.push(event("PARENT", n=3), "m-2")
    [child] = relayed(h, publisher)
    assert child.json["outcome"] == "processed" and len(runs) == 2


def test_the_partner_notification_steps_are_internal(make_harness: Make) -> None:
    h = make_harness()  # the app's own router
    payload = event(NOTIFY, kind="order-status", payload={"refund": 9999})
    payload["event_direction"] = "OUT"
    response = h.push(payload, "m-1", idempotency_key="chosen")
    assert response.json["outcome"] == "rejected"
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and stored["error"]["type"] == "InternalOnly"
    assert h.store.guard_get("chosen") is None and h.store.guard_get("p:p1:chosen") is None


# -- leases --------------------------------------------------------------------------------

def test_a_worker_whose_lease_was_taken_answers_503(make_harness: Make) -> None:
    holder: list[Harness] = []
    router = Router()

    @router.handler("TEST")
    def slow(context: Context) -> None:
        # Meanwhile the lease runs out and another worker claims the record.
        h = holder[0]
        h.clock.advance(31)
        h.store.claim(context.key, {}, h.clock())

    h = make_harness(router=router)
    holder.append(h)
    response = h.push(event("TEST"), "m-1")
    assert (response.status_code, response.json["outcome"]) == (503, "lease_lost")
    stored = h.store.get(response.json["idempotency_key"])
    assert stored is not None and stored["event_status"] == "PROCESSING"
