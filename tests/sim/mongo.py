"""The simulation on the local MongoDB-compatible server: a world's store on a real server.

``mongo_store(database)`` is a ``World(store=...)`` factory: a ``MongoEventStore``
over collections of its own in ``database``, whose clock (``$$NOW`` in every
write, and ``now()``) follows the world's virtual clock through ``Following``.
So the server decides every lease, hold and due time, as in production, at
the simulated moment; the scheduler still chooses every interleaving (each
store call is one blocking round trip, so a run is as deterministic as on the
memory store: the same seed, the same decisions, whatever the server's speed).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.database import Database

from eventbus.clock import Shift
from eventbus.settings import Settings
from eventbus.store.mongo import MongoEventStore
from eventbus.testing import FakeClock
from tests.sim.world import LEASE, SETTINGS

SIM_START = datetime.now(UTC).replace(microsecond=500000)
"""Where a MongoDB world's virtual clock starts: now, so the server's TTL monitor never
sees a record's ``expire_at`` (created + retention) in its past."""


class Following(Shift):
    """A ``Shift`` that keeps the store's clock on ``clock``: the offset is re-read each time.

    Hand-written (a subclass of the library's own test seam): the server's
    clock keeps running while the world's virtual one jumps, so the offset is
    ``clock() - now`` at each use, not a number moved by ``advance``.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock

    @property  # type: ignore[override]
    def seconds(self) -> float:
        """The virtual clock's lead over this host's (the server's, on loopback)."""
        return (self._clock() - datetime.now(UTC)).total_seconds()

    def advance(self, seconds: float) -> None:
        """Refused: the world's clock moves this one."""
        raise TypeError("a Following shift moves with its clock; advance that")


class SimMongoStore(MongoEventStore):
    """A world's MongoDB store, with the settings its feature stores are built from: the
    world's own partners and rebuilds collections (``eventbus.partners.store.store_beside``),
    so no two worlds of one database share a breaker or a run."""

    feature_settings: Settings


def mongo_store(database: Database[Any], made: list[MongoEventStore]) -> Callable[[FakeClock], Any]:
    """A world's store factory: a ``MongoEventStore`` in ``database``, appended to ``made``."""

    def build(clock: FakeClock) -> MongoEventStore:
        suffix = uuid.uuid4().hex[:8]
        store = SimMongoStore(
            database[f"events_{suffix}"], created_by="sim", retention=timedelta(days=30),
            lease=timedelta(seconds=LEASE), guard_collection=f"side_effects_{suffix}",
            shift=Following(clock))
        # model_copy, as the world's SETTINGS were made: its zero waits are no variable's.
        store.feature_settings = SETTINGS.model_copy(update=dict(
            partner_collection=f"partners_{suffix}", rebuild_collection=f"rebuilds_{suffix}"))
        store.ensure_indexes()
        made.append(store)
        return store

    return build
