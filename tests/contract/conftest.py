"""The storage contract: one suite, run against every implementation of the store protocol.

``store`` is parametrized over ``memory`` (``MemoryEventStore``, no server)
and ``mongo`` (``MongoEventStore`` on the server of ``tests/conftest.py``,
a fresh database per test). Both get the same lease, retention and service
name, so a test states one expectation and both stores must meet it.

Time: every store decides leases, holds and due times on its own clock, so
a test that lets time pass moves **the store's** clock, never the ``now`` it
hands in (which only stamps audit fields): ask for ``store_clock`` beside
``store`` and ``advance(seconds)`` it (the memory store's ``FakeClock``, the
MongoDB store's ``Shift``, both starting at real time). Under
``CI=true`` a missing server fails the mongo half (the ``mongo_uri`` rule);
the memory half never needs one.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pytest

from eventbus.clock import Shift
from eventbus.model.delivery import Delivery
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import fingerprint
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock

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


class StoreClock(Protocol):
    """What moves a store's clock: ``FakeClock`` (memory) and ``Shift`` (MongoDB) both do."""

    def advance(self, seconds: float) -> None:
        """Move the store's clock forward by ``seconds``."""


@pytest.fixture(params=KINDS)
def store_clock(request: pytest.FixtureRequest, now: datetime) -> StoreClock:
    """The movable clock of ``store`` (the same half): ``advance`` it to let time pass.

    The memory store's starts at real time, at ``now`` itself (a record's
    ``expire_at`` must stay in the future for the MongoDB TTL, and both halves
    then agree); MongoDB's is the server's, which keeps running.
    """
    if request.param == "memory":
        return FakeClock(now)
    return Shift()


class _Along(FakeClock):
    """A caller's ``FakeClock`` that moves the MongoDB store's ``Shift`` with it."""

    def __init__(self, start: datetime, shift: Shift) -> None:
        super().__init__(start)
        self._shift = shift

    def advance(self, seconds: float) -> None:
        """Move this clock and the store's by ``seconds``."""
        super().advance(seconds)
        self._shift.advance(seconds)


def caller_clock(store_clock: StoreClock, now: datetime) -> FakeClock:
    """A ``FakeClock`` for a processor or sweeper over ``store``, starting at ``now``, that moves
    the store's clock with it (on memory it is the store's clock itself)."""
    if isinstance(store_clock, FakeClock):
        return store_clock
    assert isinstance(store_clock, Shift)
    return _Along(now, store_clock)


SKEW = timedelta(minutes=10)
"""How far ahead or behind a caller's clock may be without changing any outcome."""
SLACK = timedelta(seconds=5)
"""How far the server's clock may have run on during a MongoDB test (it never stops)."""


def exact(store_clock: StoreClock) -> bool:
    """True when the store's clock stands still between calls (memory): times compare exactly."""
    return isinstance(store_clock, FakeClock)


def near(store_clock: StoreClock, actual: Any, expected: datetime) -> bool:
    """``actual`` is ``expected`` on the store's clock: exactly on memory, within ``SLACK`` on
    MongoDB, whose clock runs on while the test does."""
    if not isinstance(actual, datetime):
        return False
    if exact(store_clock):
        return actual == expected
    return abs(actual - expected) <= SLACK


def almost(store_clock: StoreClock, span: timedelta) -> float:
    """Seconds to ``advance`` to reach the very end of ``span`` (a lease's last instant
    still holds): all of it on memory, a second short of it on MongoDB, whose clock runs on."""
    return span.total_seconds() - (0 if exact(store_clock) else 1)


@pytest.fixture()
def store(request: pytest.FixtureRequest, store_clock: StoreClock) -> Iterator[EventStore]:
    """Each implementation of the store protocol in turn, empty and ready, on ``store_clock``."""
    if isinstance(store_clock, FakeClock):
        yield MemoryEventStore(lease=LEASE, created_by=SERVICE, retention=RETENTION,
                               clock=store_clock)
        return
    from eventbus.store.mongo import MongoEventStore

    # Asked for here, not in the signature: the memory half needs no server.
    uri: str = request.getfixturevalue("mongo_uri")
    database = request.getfixturevalue("mongo_db")
    assert isinstance(store_clock, Shift)
    built = MongoEventStore.from_settings(mongo_settings(uri, database.name), shift=store_clock)
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
