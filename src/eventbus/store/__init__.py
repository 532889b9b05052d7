"""Storage: the only layer that talks to the collections.

* ``base``: the store protocol (``EventStore``), one protocol per user of it
  (``ProcessorStore``, ``RenewingStore``, ``GuardStore``, ``PartnerStore``,
  ``OutboxStore``, ``RedriveStore``), and ``Claim``;
* ``documents``: pure builders of the stored documents, filters and updates;
* ``mongo``: ``MongoEventStore``, the MongoDB implementation (pymongo);
* ``memory``: ``MemoryEventStore``, the same primitives on a dict, for tests;
* ``roundtrips``: a per-store counter of the commands sent to MongoDB.

May import: ``eventbus.model``, ``eventbus.settings``, and pymongo (only in
``mongo`` and ``roundtrips``). Never the processor, transports or operations.
Importing this package does not import pymongo.
"""

from eventbus.store.base import Claim, EventStore, OutboxEntry, Record
from eventbus.store.memory import MemoryEventStore

__all__ = ["Claim", "EventStore", "MemoryEventStore", "OutboxEntry", "Record"]
