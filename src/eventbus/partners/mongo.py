"""Breakers and token buckets on MongoDB: ``MongoPartnerStore``, beside a ``MongoEventStore``.

One collection (``Settings.partner_collection``) holds both kinds of
document (``eventbus.partners.documents``). Every write is one
single-document operation: a breaker moves by compare-and-swap on its
``version``, a partner's token bucket by one upserted update pipeline decided
on the server's clock (``$$NOW``). The store shares the event store's database,
client and clock (``MongoPartnerStore.beside``); the parked events are stored events,
so the event store counts them and brings them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from eventbus.clock import Shift, store_now
from eventbus.partners.documents import (
    BREAKER,
    RateLimit,
    RateTake,
    breaker_document,
    breaker_id,
    rate_id,
    rate_pipeline,
    rate_result,
)
from eventbus.settings import Settings
from eventbus.store.base import ParkedEvents, Record

if TYPE_CHECKING:
    from eventbus.store.mongo import MongoEventStore
from eventbus.store.mongo_errors import unavailable as _unavailable

PARTNER_INDEXES = (IndexModel([("expire_at", ASCENDING)], name="expire_at_1",
                              expireAfterSeconds=0),
                   IndexModel([("kind", ASCENDING)], name="kind_1"))
"""The partners collection's indexes: full token buckets expire; breakers are listed by kind."""


class MongoPartnerStore:
    """``PartnerStore`` on MongoDB: breakers and buckets in ``collection``, parked events in
    ``events``; ``shift`` is the event store's clock shift (tests), for ``$$NOW``."""

    def __init__(self, collection: Collection, events: ParkedEvents, shift: Shift) -> None:
        self._partners, self._events, self._shift = collection, events, shift

    @classmethod
    def beside(cls, events: MongoEventStore, settings: Settings) -> MongoPartnerStore:
        """Return the partners' store on ``events``' database (``Settings.partner_collection``)."""
        return cls(events.database[settings.partner_collection], events, events.shift)

    def now(self) -> datetime:
        """The event store's clock (the server's)."""
        return self._events.now()

    def ensure_indexes(self) -> None:
        """Create the partners collection's indexes (``PARTNER_INDEXES``)."""
        with _unavailable("create indexes on", self._partners.name):
            self._partners.create_indexes(list(PARTNER_INDEXES))

    def breaker_get(self, name: str) -> Record | None:
        """Return the breaker document of ``name``, or None."""
        with _unavailable("get breaker", name):
            found: Record | None = self._partners.find_one({"_id": breaker_id(name)})
        return found

    def breaker_swap(self, name: str, version: int, document: Mapping[str, Any]) -> bool:
        """Store ``document`` if ``name``'s breaker is still at ``version`` (0: none yet)."""
        stored = breaker_document(name, version + 1, document)
        with _unavailable("swap breaker", name):
            if version == 0:
                return self._insert(stored)
            done = self._partners.replace_one({"_id": stored["_id"], "version": version}, stored)
        return done.matched_count == 1

    def _insert(self, stored: Mapping[str, Any]) -> bool:
        try:
            self._partners.insert_one(dict(stored))
        except DuplicateKeyError:  # another instance made it first
            return False
        return True

    def breakers(self) -> list[Record]:
        """Return every breaker document, by name."""
        with _unavailable("list", "breakers"):
            return list(self._partners.find({"kind": BREAKER}).sort("name", ASCENDING))

    def rate_take(self, name: str, limit: RateLimit, max_wait: timedelta) -> RateTake:
        """Take a token of ``name``'s bucket in one round trip, decided on ``$$NOW``."""
        pipeline = rate_pipeline(name, limit, max_wait, store_now(self._shift))
        with _unavailable("rate", name):
            try:
                return self._take_token(name, pipeline)
            except DuplicateKeyError:  # two first calls upserted the bucket at once
                return self._take_token(name, pipeline)

    def _take_token(self, name: str, pipeline: list[Any]) -> RateTake:
        # Upserted on _id equality: this server refuses $expr in an upsert's filter,
        # and the rule needs none (the pipeline decides on what it finds).
        after: Record | None = self._partners.find_one_and_update(
            {"_id": rate_id(name)}, pipeline, upsert=True, return_document=ReturnDocument.AFTER)
        if after is None:  # an upsert returning the document after always has one
            raise RuntimeError(f"the rate of {name!r} returned no document")
        return rate_result(after)

    def parked_counts(self) -> dict[str, int]:
        """Return partner → number of parked events (the event store's count)."""
        return self._events.parked_counts()

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for ``name`` due for the redrive now (the event store)."""
        return self._events.unpark(name, now)
