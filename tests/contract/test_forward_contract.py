"""Forwarding entries on both stores: stored with SUCCESS, swept, marked, left out of cascades.

A forward to a public topic is an outbox entry of the event's own document
(``eventbus.model.forward``). Both stores must keep it with the SUCCESS
update, give the sweeper the PENDING ones only (a FAILED forward is never
published), mark it PUBLISHED once, and leave it out of the cascade view's
summaries (no event is ever stored for it).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from eventbus import Router, contract
from eventbus.model.event import event_from_document
from eventbus.model.forward import forward_key
from eventbus.store import documents
from eventbus.store.base import EventStore
from tests.contract.conftest import EVENT, FIELDS, new_key


@contract("order-status", "v1")
@dataclasses.dataclass(frozen=True)
class Status:
    """The public shape."""

    order_id: int
    status: str


@contract("order-status", "v2")
@dataclasses.dataclass(frozen=True)
class StatusV2:
    """v1 and a field v1's events cannot fill (``entity_data.missing``)."""

    order_id: int
    status: str
    missing: str


ROUTES = Router()
ROUTES.forward("OR_MGMT", topic="order-status", contract=Status,
               fields={"order_id": "entity_data.orderId", "status": "entity_data.status"})
ROUTES.forward("OR_MGMT", topic="order-status", contract=StatusV2,
               fields={"order_id": "entity_data.orderId", "status": "entity_data.status",
                       "missing": "entity_data.missing"})


def succeed_with_forwards(store: EventStore, now: datetime) -> str:
    key = new_key()
    claim = store.claim(key, FIELDS, now)
    created = documents.bson_time(now)
    outbox = ROUTES.forwards.entries(event_from_document(EVENT.to_document()), key, key,
                                     created)
    assert store.succeed(key, claim.owner, now, outbox)
    return key


def test_forwards_are_stored_with_success(store: EventStore, now: datetime) -> None:
    key = succeed_with_forwards(store, now)
    record = store.get(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    v1, v2 = record["outbox"]
    assert (v1["kind"], v1["topic"], v1["status"], v1["body"]) == (
        "public", "order-status", "PENDING", {"version": "v1", "order_id": 59734,
                                              "status": "$OR_PLC"})
    assert v1["idempotency_key"] == forward_key(key, "order-status", "v1")
    assert (v2["status"], "body" in v2) == ("FAILED", False)
    assert "missing: required" in v2["error"]["message"]


def test_the_sweeper_gets_pending_forwards_only_and_marks_them_once(
        store: EventStore, now: datetime) -> None:
    key = succeed_with_forwards(store, now)
    pending = [item for item in store.pending_outbox(now + timedelta(seconds=1))
               if item.parent_key == key]
    assert [(item.index, item.entry["contract_version"]) for item in pending] == [(0, "v1")]
    assert store.mark_published(pending[0], now, "msg-1", 1)
    assert not store.mark_published(pending[0], now, "msg-2", 1)
    record = store.get(key)
    assert record is not None
    assert (record["outbox"][0]["status"], record["outbox"][0]["messageId"]) == \
        ("PUBLISHED", "msg-1")
    assert [item for item in store.pending_outbox(now + timedelta(seconds=1))
            if item.parent_key == key] == []


def test_summaries_leave_forwards_out_of_the_cascade(store: EventStore, now: datetime) -> None:
    key = succeed_with_forwards(store, now)
    (summary,) = [doc for doc in store.summaries({key}) if doc["idempotency_key"] == key]
    assert summary.get("outbox", []) == []
