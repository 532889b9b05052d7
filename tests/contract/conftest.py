"""The storage contract: one suite, run against every implementation of the store protocol.

``store`` is parametrized over ``memory`` (``MemoryEventStore``, no server)
and ``mongo`` (``MongoEventStore`` on the server of ``tests/conftest.py``,
a fresh database per test). Both get the same lease, retention and service
name, so a test states one expectation and both stores must meet it. Under
``CI=true`` a missing server fails the mongo half (the ``mongo_uri`` rule);
the memory half never needs one.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from eventbus.model.delivery import Delivery
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import fingerprint
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.store.memory import MemoryEventStore

LEASE = timedelta(seconds=60)
RETENTION = timedelta(days=30)
SERVICE = "test-svc"
KINDS = ["memory", "mongo"]

EVENT = Event(event_type="OR_MGMT", event_version="v2", event_direction="IN",
              entity_metadata=EntityMetadata(partner_id="p-1", entity_id="order-1",
                                             entity_type="Order", partner_name="Acme"),
              entity_data={"orderId": 59734, "status": "$OR_PLC", "lines": [{"sku": "a"}]})
DELIVERY = Delivery(data=b"{}", attributes={}, message_id="m-1",
                    publish_time="2026-05-01T12:00:00Z", subscription="projects/p/subs/s",
                    delivery_attempt=1)
FIELDS = documents.event_fields(EVENT, DELIVERY, fingerprint=fingerprint(EVENT))
ERROR = {"type": "PartnerUnavailable", "message": "503", "classification": "transient"}


def mongo_settings(uri: str, database: str, **changes: Any) -> Settings:
    """The settings of the mongo half: the same lease, retention and service as memory's."""
    return Settings(**{"mongodb_uri": uri, "mongodb_db": database, "service": SERVICE,
                       "lease_seconds": LEASE.total_seconds(),
                       "retention_days": RETENTION / timedelta(days=1), **changes})


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """Each implementation of the store protocol in turn, empty and ready."""
    if request.param == "memory":
        yield MemoryEventStore(lease=LEASE, created_by=SERVICE, retention=RETENTION)
        return
    from eventbus.store.mongo import MongoEventStore

    # Asked for here, not in the signature: the memory half needs no server.
    uri: str = request.getfixturevalue("mongo_uri")
    database = request.getfixturevalue("mongo_db")
    built = MongoEventStore.from_settings(mongo_settings(uri, database.name))
    built.ensure_indexes()
    yield built
    built.close()


@pytest.fixture()
def now() -> datetime:
    """Real time at the server's grain, not a fixed date.

    The server's TTL monitor deletes records whose ``expire_at`` (created +
    retention) has passed, so records are created now.
    """
    return documents.bson_time(datetime.now(UTC))


def new_key() -> str:
    """A key no other test uses."""
    return f"order-1:OR_MGMT:{uuid.uuid4().hex}"


def without_id(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``record`` without MongoDB's ``_id``, which the memory store does not invent."""
    if record is None:
        return None
    return {name: value for name, value in record.items() if name != "_id"}


def put_raw(store: EventStore, document: Mapping[str, Any]) -> None:
    """Write ``document`` as another tool would, around the primitives (tests only).

    Seeds states the primitives never produce themselves: a PENDING record
    written elsewhere, a record with odd fields.
    """
    if isinstance(store, MemoryEventStore):
        with store._lock:
            store._events[document["idempotency_key"]] = copy.deepcopy(dict(document))
        return
    store.collection.insert_one(dict(document))  # type: ignore[attr-defined]
