"""The partners' store beside a test's event store (``eventbus.partners.store.store_beside``).

Breakers and rate buckets live in the partners' own store since issue 41; a test that
reads them straight from the store reads them from the one beside its event store, which
shares the event store's database (memory or MongoDB) and so sees what its partners wrote.
"""

from __future__ import annotations

from typing import Any

from eventbus.partners.store import PartnerStore, store_beside
from eventbus.settings import Settings


def beside(events: Any) -> PartnerStore:
    """The partners' store on ``events``' database, with the default collection."""
    return store_beside(events, Settings())
