"""The rebuild's run store beside a test's event store (``eventbus.rebuild.store.runs_beside``).

A rebuild's runs and plans live in its own store since issue 41; a test that reads them
reads them from the one beside its event store, on the same database (memory or MongoDB).
"""

from __future__ import annotations

from typing import Any

from eventbus.rebuild.store import RunStore, runs_beside
from eventbus.settings import Settings


def runs_of(events: Any) -> RunStore:
    """The run store on ``events``' database, with the default collection."""
    return runs_beside(events, Settings())
