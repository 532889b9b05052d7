"""Public topics through the real app on the in-memory store: forwarded once, in public shape.

The partner app forwards confirmed, shipped, delivered and cancelled orders to
``order-status`` in two contract versions (``handlers/public.py``). The relay
here is the real one on a capturing publisher, which records the topic.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from eventbus.model.forward import forward_key
from eventbus.ops.commands.queries import show_text
from eventbus.ops.reports import event_view, forwarded
from eventbus.outbox.relay import Relay
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, Message
from eventbus.workers.pull import Inbox, PullWorker
from tests.closing import closed_after_test
from tests.service.conftest import START, Make, app_router, memory_database


def order_event(status: str = "OR_SHP", order_id: Any = 41, **extra: Any) -> dict[str, Any]:
    data = {"orderId": order_id, "orderStatusLatest": status,
            "orderStatusLatestTimestamp": 1764000000, "orderLineItems": [{"sku": "a"}], **extra}
    return {"event_type": "OR_MGMT", "event_version": "v2",
            "entity_metadata": {"partnerId": "p1", "partnerName": "Partner One",
                                "entity_id": f"o-{order_id}", "entity_type": "Order"},
            "entity_data": data}


def public(publisher: CapturingPublisher) -> list[Message]:
    return [m for m in publisher.messages if m.topic == "order-status"]


def relayed(make: Make) -> tuple[Any, CapturingPublisher]:
    publisher = CapturingPublisher()
    harness = make()
    relay = Relay(harness.store, publisher, now=harness.clock, sleep=lambda _: None)
    harness.app.extensions["eventbus"].processor.after_success = relay
    return harness, publisher


def test_a_shipped_order_is_forwarded_once_per_version_in_the_public_shape(make_harness: Make
                                                                             ) -> None:
    harness, publisher = relayed(make_harness)
    answer = harness.push(order_event(), idempotency_key="order-41-shipped")
    assert answer.get_json()["outcome"] == "processed"
    key = "p:p1:order-41-shipped"  # the record's key: the publisher's, under its partner
    v1, v2 = public(publisher)
    assert json.loads(v1.data) == {"version": "v1", "order_id": "41", "partner_id": "p1",
                                   "status": "OR_SHP", "changed_at": 1764000000}
    assert json.loads(v2.data)["status_name"] == "shipped"
    assert v1.attributes["idempotency_key"] == v2.attributes["idempotency_key"] == key
    assert (v1.attributes["contract"], v1.attributes["contract_version"]) == \
        ("order-status", "v1")
    assert v1.attributes["forward_id"] == forward_key(key, "order-status", "v1")
    assert not {"event_type", "parent_key", "root_key"} & set(v1.attributes)
    stored = harness.store.get(key)
    assert [(e["contract_version"], e["status"], e["messageId"])
            for e in stored["outbox"] if e.get("kind") == "public"] == [
        ("v1", "PUBLISHED", v1.message_id), ("v2", "PUBLISHED", v2.message_id)]


def test_a_duplicate_delivery_forwards_nothing_new(make_harness: Make) -> None:
    harness, publisher = relayed(make_harness)
    harness.push(order_event(), idempotency_key="k-dup")
    answer = harness.push(order_event(), message_id="m-2", idempotency_key="k-dup")
    assert answer.get_json()["outcome"] == "duplicate"
    assert len(public(publisher)) == 2


def test_events_not_declared_public_never_reach_the_topic(make_harness: Make) -> None:
    harness, publisher = relayed(make_harness)
    harness.push(order_event(status="OR_PLC"), idempotency_key="placed")
    harness.push({"event_type": "SUB_MGMT", "event_version": "v1",
                  "entity_metadata": {"partnerId": "p1", "entity_id": "s-1",
                                      "entity_type": "Subscription"},
                  "entity_data": {"subscriptionId": 3, "status": "ACTIVE",
                                  "plan": "basic"}}, message_id="m-2")
    assert public(publisher) == []
    assert all(m.topic is None for m in publisher.messages)


def test_an_event_the_contract_cannot_hold_is_recorded_not_forwarded_half_built(
        make_harness: Make) -> None:
    harness, publisher = relayed(make_harness)
    answer = harness.push(order_event(orderLineItems="several"), idempotency_key="odd")
    assert answer.get_json()["outcome"] == "processed"  # the business effect is done
    (v1,) = public(publisher)
    assert json.loads(v1.data)["version"] == "v1"
    assert harness.db.order_projection.count_documents({}) == 1
    rows = forwarded(harness.store.get("p:p1:odd"))
    assert [row[:3] for row in rows] == [["order-status", "order-status@v1", "PUBLISHED"],
                                         ["order-status", "order-status@v2", "FAILED"]]
    assert "orderLineItems is not a list" in rows[1][4]
    view = event_view(harness.store, "p:p1:odd")
    assert view is not None and "forwarded:" in show_text(view)


def test_the_sweeper_forwards_what_a_crash_left_pending_and_only_once(make_harness: Make
                                                                      ) -> None:
    harness = make_harness()  # no inline relay: as if the worker died after SUCCESS
    harness.push(order_event(), idempotency_key="crashed")
    entries = [e for e in harness.store.get("p:p1:crashed")["outbox"]
               if e.get("kind") == "public"]
    assert [e["status"] for e in entries] == ["PENDING", "PENDING"]
    publisher = CapturingPublisher()
    harness.clock.advance(60)
    sweeper = Relay(harness.store, publisher, now=harness.clock, sleep=lambda _: None)
    first, second = sweeper.sweep(dt.timedelta(seconds=30)), \
        sweeper.sweep(dt.timedelta(seconds=30))
    assert (first.published, second.published) == (3, 0)  # two forwards and the child
    assert len(public(publisher)) == 2


def test_the_pull_worker_forwards_like_push() -> None:
    store = MemoryEventStore(lease=dt.timedelta(seconds=30), database=memory_database())
    publisher = CapturingPublisher()
    from eventbus.processor import Processor
    from eventbus.testing import FakeClock

    clock = FakeClock(START)
    relay = Relay(store, publisher, now=clock, sleep=lambda _: None)
    processor = closed_after_test(Processor(store, app_router(), Settings(relay_inline=False),
                                            clock, after_success=relay))
    worker = PullWorker(processor, Inbox(), subscription="s", batch_size=10)

    class Pulled:
        def __init__(self, n: int) -> None:
            self.data = json.dumps(order_event(order_id=n)).encode()
            self.attributes = {"idempotency_key": f"pulled-{n}"}
            self.message_id, self.ordering_key, self.delivery_attempt = f"m{n}", "", 1
            self.acked = False

        def ack(self) -> None:
            self.acked = True

        def nack(self) -> None:
            raise AssertionError("nothing here is transient")

        def ack_with_response(self) -> Any:
            raise NotImplementedError

    batch = [Pulled(n) for n in range(3)] + [Pulled(1)]  # one duplicate in the batch
    worker.run_batch(batch)
    assert all(m.acked for m in batch)
    keys = sorted(m.attributes["idempotency_key"] for m in public(publisher))
    assert keys == sorted([f"p:p1:pulled-{n}" for n in range(3)] * 2)


def test_localbus_keeps_what_went_to_a_public_topic_aside() -> None:
    from eventbus.testing import LocalBus

    bus = closed_after_test(LocalBus(app_router(), database=memory_database()))
    entity = {"partnerId": "p1", "entity_id": "o-9", "entity_type": "Order"}
    key = bus.publish("OR_MGMT", {"orderId": 9, "orderStatusLatest": "OR_CNL",
                                  "orderStatusLatestTimestamp": 1764000000},
                      entity=entity, version="v2", idempotency_key="local-9")
    v1, v2 = bus.forwarded["order-status"]
    assert json.loads(v1.data)["status"] == "OR_CNL" and v2.attributes["contract_version"] == "v2"
    assert v1.attributes["idempotency_key"] == key
    assert all(r.event_type != "OR_MGMT" or r.key == key for r in bus.results)
