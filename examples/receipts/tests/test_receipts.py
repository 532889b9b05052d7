"""The service's handlers and cascade, tested with LocalBus: no MongoDB, no emulator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receipts.handlers import RECEIPT_SEND, create_router

from eventbus.testing import LocalBus

ENTITY = {"partnerId": "shop-1", "entity_id": "order-7", "entity_type": "Order"}


class Outbox:
    """A sender that records receipts and can fail a number of times first."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[Mapping[str, Any]] = []
        self.failures = failures

    def __call__(self, receipt: Mapping[str, Any]) -> str:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("mail server down")
        self.sent.append(receipt)
        return f"mail-{len(self.sent)}"


def test_an_order_sends_one_receipt_through_the_cascade() -> None:
    outbox = Outbox()
    bus = LocalBus(create_router(outbox))
    key = bus.publish("ORDER_PLACED", {"total": 42, "email": "a@example.com"}, entity=ENTITY)
    child = (bus.record(key) or {})["outbox"][0]["idempotency_key"]
    assert (bus.record(key) or {})["event_status"] == "SUCCESS"
    assert (bus.record(child) or {})["event_status"] == "SUCCESS"
    assert (bus.record(child) or {})["event_type"] == RECEIPT_SEND
    assert outbox.sent == [{"email": "a@example.com", "total": 42}]
    assert RECEIPT_SEND in bus.cascade(key)


def test_the_same_order_published_again_sends_nothing_more() -> None:
    outbox = Outbox()
    bus = LocalBus(create_router(outbox))
    for _ in range(2):
        bus.publish("ORDER_PLACED", {"total": 5}, entity=ENTITY, idempotency_key="order-7")
    assert [result.outcome.value for result in bus.results] == \
        ["processed", "processed", "duplicate"]
    assert len(outbox.sent) == 1


def test_a_bad_total_is_stored_failed_for_good_and_sends_nothing() -> None:
    outbox = Outbox()
    bus = LocalBus(create_router(outbox))
    key = bus.publish("ORDER_PLACED", {"total": -1}, entity=ENTITY)
    record = bus.record(key) or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is False
    assert outbox.sent == []


def test_a_failed_send_is_retried_and_then_sent_once() -> None:
    outbox = Outbox(failures=1)
    bus = LocalBus(create_router(outbox))
    key = bus.publish("ORDER_PLACED", {"total": 9}, entity=ENTITY)
    child = (bus.record(key) or {})["outbox"][0]["idempotency_key"]
    assert (bus.record(child) or {})["event_status"] == "FAILED"
    assert bus.redeliver(child).outcome.value == "processed"
    assert bus.redeliver(child).outcome.value == "duplicate"
    assert len(outbox.sent) == 1
