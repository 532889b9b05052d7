"""Cascades through the test client: emit, the inline relay, the partner call, the record.

The app runs its real handlers (``handlers.create_router``) on the in-memory
store, with projections and notifications in a mongomock database. The
relay publishes into a ``CapturingPublisher``; the test pushes each captured
message back to the app, as Pub/Sub would. The partner is a real local HTTP
server (``PartnerServer``) that fails on cue. The partner call's guard
record is the store's (``store.guard_get(key)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.errors import StoreUnavailable, TransientError
from eventbus.model.forward import is_forward
from eventbus.model.keys import child_key
from eventbus.model.router import Router
from eventbus.outbox.relay import Backoff, Relay
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock, Message
from handlers import notifications
from handlers.notifications import NOTIFY, SENT
from handlers.orders import on_order_event, order_v1_to_v2
from handlers.settings import PartnerSettings
from tests.closing import closed_after_test
from tests.partner_server import PartnerServer
from tests.service.conftest import START, Harness, Make, event


def order(status: str = "OR_CNF", order_id: int = 59734) -> dict[str, Any]:
    return {"event_type": "OR_MGMT", "event_version": "v2",
            "entity_metadata": {"partnerId": "p/1", "partnerName": "Partner One",
                                "entity_id": f"order-{order_id}", "entity_type": "Order"},
            "entity_data": {"orderId": order_id, "orderStatusLatest": status,
                            "orderStatusLatestTimestamp": 1655292804}}


class DeadStore(MemoryEventStore):
    """A store whose server is gone: the outbox primitives the relay uses fail."""

    def _down(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("mark_published: ServerSelectionTimeoutError: 127.0.0.1:9 refused")

    mark_published = mark_publish_failed = pending_outbox = _down  # type: ignore[assignment]


@dataclasses.dataclass
class Cascade:
    """The app with a capturing relay and a scripted partner."""

    h: Harness
    publisher: CapturingPublisher
    partner: PartnerServer

    def run(self, first: dict[str, Any], rounds: int = 10) -> str:
        """Push ``first``, then its cascade, redelivering on 503 as Pub/Sub would.

        Return the root key.
        """
        responses = [self.h.push(first)]
        while responses[-1].status_code == 503 and len(responses) < rounds:
            responses.append(self.h.push(first))
        root = responses[0].json["idempotency_key"]
        queue = self.publisher.take()
        for _ in range(rounds):
            if not queue:
                break
            nacked = [m for m in queue
                      if self.h.push(m.data, m.message_id, **m.attributes).status_code == 503]
            queue = nacked + self.publisher.take()
        assert not queue, f"still undelivered after {rounds} rounds: {queue}"
        return str(root)


@pytest.fixture(params=[False, True], ids=["sync-notify", "async-notify"])
def notify_async(request: pytest.FixtureRequest) -> bool:
    """The partner call runs as the sync notifier and as the ``async def`` one (httpx)."""
    return bool(request.param)


@pytest.fixture()
def partner() -> Iterator[PartnerServer]:
    with PartnerServer() as server:
        yield server


def cascade(make_harness: Make, partner: PartnerServer, publisher: CapturingPublisher | None = None,
            router: Router | None = None, **overrides: Any) -> Cascade:
    publisher = publisher or CapturingPublisher()
    clock = FakeClock(START)
    relays: list[Relay] = []  # the relay needs the harness's store, made just below
    h = make_harness(router=router, after_success=lambda key, outbox: relays[0](key, outbox),
                     clock=clock, publisher=publisher, partner_url=partner.template,
                     **overrides)
    relays.append(Relay(h.store, publisher, now=clock, budget=2.0,
                        sleep=lambda seconds: None, jitter=lambda: 0.5))
    return Cascade(h, publisher, partner)


def children(outbox: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cascade's children in an outbox (an order is also forwarded to a public topic)."""
    return [entry for entry in outbox if not is_forward(entry)]


def on_the_bus(messages: list[Message]) -> list[Message]:
    """What was published to the event bus (not to a public topic)."""
    return [message for message in messages if message.topic is None]


def test_an_order_cascades_to_one_partner_call_and_one_record(
        make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner)
    root = c.run(order())
    notify, sent = child_key(root, NOTIFY, 0), child_key(child_key(root, NOTIFY, 0), SENT, 0)
    for key in (root, notify, sent):
        assert c.h.store.get(key)["event_status"] == "SUCCESS", key
    for key in (root, notify):
        (entry,) = children(c.h.store.get(key)["outbox"])
        assert entry["status"] == "PUBLISHED" and entry["messageId"].startswith("msg-")
    assert c.h.store.get(notify)["parent_key"] == root
    assert c.h.store.get(sent)["parent_key"] == notify
    assert c.h.store.get(sent)["root_key"] == c.h.store.get(notify)["root_key"] == root
    (call,) = partner.calls
    assert call.path == "/partners/p%2F1/events" and call.key == notify
    assert call.body["payload"] == {"orderId": 59734, "status": "OR_CNF", "asOf": 1655292804}
    notification = c.h.db.partner_notifications.find_one()
    assert notification["_id"] == notify and notification["status"] == "SENT"
    assert notification["statusCode"] == 200 and notification["kind"] == "order-status"
    guard = c.h.store.guard_get(notify)
    assert guard is not None and (guard["status"], guard["attempts"]) == ("SUCCESS", 1)
    assert guard["result"]["status_code"] == 200 and "lease_owner" not in guard


def test_the_relay_publishes_the_standard_attributes(
        make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner)
    root = c.h.push(order()).json["idempotency_key"]
    (message,) = on_the_bus(c.publisher.messages)
    attributes = dict(message.attributes)
    assert attributes.pop("traceparent").startswith("00-")  # the trace: tests/telemetry
    assert attributes == {"event_type": NOTIFY, "event_version": "v1",
                          "idempotency_key": child_key(root, NOTIFY, 0),
                          "parent_key": root, "root_key": root}
    assert message.timeout is not None and 0 < message.timeout <= 2.0


def test_a_status_the_partner_does_not_want_emits_nothing(
        make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner)
    root = c.run(order("OR_PLC"))
    assert "outbox" not in c.h.store.get(root) and partner.calls == []


def test_a_child_published_twice_is_harmless(make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner)
    c.h.push(order())
    (message,) = on_the_bus(c.publisher.take())
    first = c.h.push(message.data, "again-1", **message.attributes)
    second = c.h.push(message.data, "again-2", **message.attributes)
    assert first.json["outcome"] == "processed" and second.json["outcome"] == "duplicate"
    assert len(partner.calls) == 1 and len(on_the_bus(c.publisher.messages)) == 1


def test_partner_down_retries_only_the_call_step(make_harness: Make) -> None:
    with PartnerServer([503, 503]) as partner:
        c = cascade(make_harness, partner)
        root = c.run(order())
    notify = child_key(root, NOTIFY, 0)
    assert [call.status for call in partner.calls] == [503, 503, 200]
    assert partner.successes() == {notify: 1}
    assert c.h.store.get(root)["attempts"] == 1 and c.h.store.get(notify)["attempts"] == 3
    assert c.h.db.partner_notifications.count_documents({}) == 1
    guard = c.h.store.guard_get(notify)
    assert guard is not None and (guard["status"], guard["attempts"]) == ("SUCCESS", 3)
    assert guard["result"]["status_code"] == 200


def test_partner_rejection_fails_the_step_for_good(make_harness: Make) -> None:
    with PartnerServer([400]) as partner:
        c = cascade(make_harness, partner)
        root = c.run(order())
    notify = c.h.store.get(child_key(root, NOTIFY, 0))
    assert notify["event_status"] == "FAILED" and notify["retryable"] is False
    assert notify["error"]["type"] == "PartnerRejected" and "outbox" not in notify
    assert len(partner.calls) == 1
    guard = c.h.store.guard_get(child_key(root, NOTIFY, 0))
    assert guard is not None and guard["status"] == "FAILED"
    assert guard["error"]["classification"] == "permanent" and "400" in guard["error"]["message"]


def test_a_failing_handler_emits_nothing_and_its_retry_emits_the_same_keys(
        make_harness: Make, partner: PartnerServer) -> None:
    def emit_then_fail(context: Context) -> None:
        context.emit("CHILD", {"n": 1})
        context.emit("CHILD", {"n": 2})
        if context.attempt == 1:
            raise TransientError("after emitting")

    test_router = Router()
    test_router.handler("TEST")(emit_then_fail)
    c = cascade(make_harness, partner, router=test_router)
    failed = c.h.push(event())
    key = failed.json["idempotency_key"]
    assert failed.status_code == 503 and "outbox" not in c.h.store.get(key)
    assert c.publisher.tries == 0
    assert c.h.push(event()).status_code == 200
    entries = c.h.store.get(key)["outbox"]
    assert [e["idempotency_key"] for e in entries] == [child_key(key, "CHILD", 0),
                                                       child_key(key, "CHILD", 1)]
    assert [m.attributes["idempotency_key"] for m in c.publisher.messages] == \
        [e["idempotency_key"] for e in entries]


def test_an_order_retried_after_its_projection_still_emits(
        make_harness: Make, partner: PartnerServer) -> None:
    def fail_after_projection(context: Context) -> None:
        on_order_event(context)
        if context.attempt == 1:
            raise TransientError("crash after the projection")

    test_router = Router().include(
        notifications.create_routes(PartnerSettings(url=partner.template)))
    test_router.handler("OR_MGMT", versions=("v2",),
                        upcasters={"v1": order_v1_to_v2})(fail_after_projection)
    c = cascade(make_harness, partner, router=test_router)
    root = c.run(order())
    assert c.h.store.get(root)["attempts"] == 2
    assert c.h.db.order_projection.find_one()["eventsApplied"] == 1
    assert partner.successes() == {child_key(root, NOTIFY, 0): 1}


def test_publish_failures_never_fail_a_processed_parent(
        make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner, publisher=CapturingPublisher(failures=100))
    response = c.h.push(order())
    assert response.status_code == 200 and response.json["outcome"] == "processed"
    (entry,) = children(c.h.store.get(response.json["idempotency_key"])["outbox"])
    assert entry["status"] == "PENDING" and entry["publish_attempts"] == Backoff().tries
    assert entry["last_error"]["message"] == "injected publish failure"


def test_a_hook_that_raises_never_fails_a_processed_parent(
        make_harness: Make, partner: PartnerServer) -> None:
    def broken(parent_key: str, outbox: Any) -> None:
        raise RuntimeError("relay bug")

    h = make_harness(after_success=broken, partner_url=partner.template)
    response = h.push(order())
    assert response.status_code == 200 and response.json["outcome"] == "processed"


def test_a_store_outage_in_the_relay_never_fails_a_processed_parent(
        make_harness: Make, partner: PartnerServer) -> None:
    relay = Relay(DeadStore(), CapturingPublisher(), now=FakeClock(START), budget=1.0)
    h = make_harness(after_success=relay, partner_url=partner.template)
    response = h.push(order())
    assert response.status_code == 200 and response.json["outcome"] == "processed"


def test_a_cancelled_subscription_notifies_the_partner_through_the_same_cascade(
        make_harness: Make, partner: PartnerServer) -> None:
    c = cascade(make_harness, partner)
    cancelled = {"event_type": "SUB_MGMT", "event_version": "v1",
                 "entity_metadata": {"partnerId": "p1", "entity_id": "sub-1",
                                     "entity_type": "Sub"},
                 "entity_data": {"subscriptionId": "sub-1", "status": "CANCELLED",
                                 "updatedAt": 1700000000}}
    root = c.run(cancelled)
    (call,) = partner.calls
    assert call.key == child_key(root, NOTIFY, 0)
    assert call.body["kind"] == "subscription-cancelled" and call.body["entity_type"] == "Sub"
    assert c.h.db.partner_notifications.count_documents({}) == 1


def test_a_child_is_serialised_once_from_emit_to_its_published_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's JSON is made when it is emitted; its hash and its published data reuse it."""
    import json as json_module

    from eventbus.model import context as context_module
    from eventbus.model import keys
    from eventbus.model.delivery import Delivery
    from eventbus.outbox import relay as relay_module
    from eventbus.pubsub.message import build_event, build_message
    from eventbus.testing import LocalBus

    made: list[str] = []

    def counting(value: object) -> str:
        if isinstance(value, dict) and value.get("event_type") == "CHILD":
            made.append("CHILD")
        return keys.canonical_json(value)

    for module in (context_module, relay_module):
        monkeypatch.setattr(module, "canonical_json", counting)
    monkeypatch.setattr(keys, "fingerprint_document", lambda document: (
        made.append("CHILD") if document.get("event_type") == "CHILD" else None)
        or keys.fingerprint_text(keys.canonical_json(document)))
    routes = Router()
    routes.handler("PARENT")(lambda context: context.emit("CHILD", {"n": [1, 2]}))
    routes.handler("CHILD", internal=True)(lambda context: None)
    bus = closed_after_test(LocalBus(routes))
    entity = {"partnerId": "p1", "entity_id": "e-1", "entity_type": "Order"}
    body, attributes = build_message(build_event("PARENT", {}, entity=entity))
    bus.processor.process(Delivery(data=body, attributes=attributes, message_id="m-1"))
    (child,) = [message for message in bus.publisher.take()
                if message.attributes.get("event_type") == "CHILD"]
    assert json_module.loads(child.data)["entity_data"] == {"n": [1, 2]}
    assert made == ["CHILD"]
