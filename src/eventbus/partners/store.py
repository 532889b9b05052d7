"""The partners' store protocol: breakers and token buckets, and the parked events they hold.

``MongoPartnerStore`` (``eventbus.partners.mongo``: the partners collection) and
``MemoryPartnerStore`` (``eventbus.partners.memory``) implement it. Both are built
beside the event store (``store_beside``), whose clock they decide on and which
answers for the parked events (``ParkedEvents``: they are stored events).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast

from eventbus.partners.documents import RateLimit, RateTake
from eventbus.settings import Settings
from eventbus.store import on_mongodb
from eventbus.store.base import ParkedEvents, Record

if TYPE_CHECKING:
    from eventbus.store.memory import MemoryEventStore


class PartnerStore(ParkedEvents, Protocol):
    """What partners use (``eventbus.partners``): breakers, shared rates, parked events."""

    def ensure_indexes(self) -> None:
        """Prepare the store (its collection's indexes); a no-op when it is ready."""
        ...

    def breaker_get(self, name: str) -> Record | None:
        """Return the breaker document of partner ``name`` (``version`` included), or None."""
        ...

    def breaker_swap(self, name: str, version: int, document: Mapping[str, Any]) -> bool:
        """Store ``document`` as ``name``'s breaker if its version is still ``version``.

        Version 0 means "no document yet"; the stored one gets ``version + 1``.
        False when another instance changed it first (read again and retry).
        One single-document write, so every instance shares one breaker.
        """
        ...

    def breakers(self) -> list[Record]:
        """Return every breaker document, by name."""
        ...

    def rate_take(self, name: str, limit: RateLimit, max_wait: timedelta) -> RateTake:
        """Take a token of partner ``name``'s shared bucket, decided on the store's clock.

        One atomic single-document write, one round trip (GCRA:
        ``eventbus.partners.documents.rate_step``). ``taken``: the call may go at
        ``until`` (now, or at most ``max_wait`` later; the token is reserved
        for it). Not taken: nothing was spent, and ``until`` is when the next
        token is free. No caller's clock takes part, so callers whose clocks
        differ get the same answers.
        """
        ...


def store_beside(events: ParkedEvents, settings: Settings) -> PartnerStore:
    """Return the partners' store beside the event store ``events``: the same database.

    A ``MongoEventStore`` gets a ``MongoPartnerStore`` on its database (the
    collection ``Settings.partner_collection``, its clock); any other store (the
    memory store) a ``MemoryPartnerStore`` in its memory database (``on_mongodb``
    tells them apart without importing pymongo).
    """
    if on_mongodb(events):
        from eventbus.partners.mongo import MongoPartnerStore

        return MongoPartnerStore.beside(events, settings)
    from eventbus.partners.memory import MemoryPartnerStore

    return MemoryPartnerStore(cast("MemoryEventStore", events), settings.partner_collection)
