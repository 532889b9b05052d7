"""Storage of the event collection (and the guard's records): the only core layer that
talks to a collection.

* ``base``: the store protocol (``EventStore``), one protocol per user of it
  (``ProcessorStore``, ``RenewingStore``, ``GuardStore``, ``ParkedEvents``,
  ``OutboxStore``, ``RedriveStore``, ``RebuildStore``), and ``Claim``;
* ``documents``: pure builders of the stored documents, filters and updates;
* ``mongo``: ``MongoEventStore``, the MongoDB implementation (pymongo), with its
  mixins ``mongo_batch`` (batches), ``mongo_ops`` (operator reads and repairs),
  ``mongo_replays`` (a rebuild's claims), and ``mongo_errors`` (pymongo's errors
  as ``StoreUnavailable``);
* ``memory``: ``MemoryEventStore``, the same primitives on a dict, for tests, with
  ``memory_batch``, ``memory_ops`` and ``memory_replays``; it is also the memory
  database the features' memory stores keep their collections in;
* ``operator_queries``: the operator's queries (``OperatorStore``);
* ``roundtrips``: a per-store counter of the commands sent to MongoDB.

The features keep their own stores beside this one (``eventbus.partners.store``,
``eventbus.rebuild.store``). May import: ``eventbus.model``, ``eventbus.settings``,
``eventbus.clock``, and pymongo (only in the ``mongo`` modules and ``roundtrips``).
Never the processor, transports, operations or a feature.
Importing this package does not import pymongo.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

from eventbus.store.base import Claim, EventStore, OutboxEntry, Record
from eventbus.store.memory import MemoryEventStore

if TYPE_CHECKING:
    from eventbus.store.mongo import MongoEventStore

__all__ = ["Claim", "EventStore", "MemoryEventStore", "OutboxEntry", "Record", "on_mongodb"]


def on_mongodb(events: object) -> TypeGuard[MongoEventStore]:
    """True when ``events`` is a ``MongoEventStore``: what a feature's store beside it is
    built on (``store_beside``, ``runs_beside``). Recognised through ``sys.modules``: where
    ``eventbus.store.mongo`` was never imported no store can be one, and pymongo is not
    imported to find out."""
    mongo = sys.modules.get("eventbus.store.mongo")
    return mongo is not None and isinstance(events, mongo.MongoEventStore)
