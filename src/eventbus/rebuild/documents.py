"""A rebuild's own documents: its run (progress, report, checkpoint) and its frozen plan.

Both live in the rebuild collection (``Settings.rebuild_collection``), written by
the run store (``eventbus.rebuild.store``). What a rebuild writes on the event
records themselves (its lease, its audit entries, what it made) is the event
store's: ``eventbus.store.documents.replays``, re-exported here for the feature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from eventbus.store.documents.replays import (
    LEASE,
    MADE,
    made_unfinished,
    rebuild_claim_filter,
    rebuild_claim_update,
    rebuild_finish_update,
    rebuild_finished,
    rebuild_held,
    rebuild_lease,
    rebuild_owner_filter,
    rebuild_renew_update,
    rebuildable,
    rebuilt_by,
)

__all__ = ["LEASE", "MADE", "PLAN_OF", "PLAN_PAGE_BYTES", "RUNS", "made_unfinished",
           "plan_pages", "rebuild_claim_filter", "rebuild_claim_update", "rebuild_finish_update",
           "rebuild_finished", "rebuild_held", "rebuild_lease", "rebuild_owner_filter",
           "rebuild_renew_update", "rebuildable", "rebuilt_by", "run_document"]

PLAN_OF = "plan_of"
"""The field naming the rebuild a plan page belongs to (pages share the run collection)."""
PLAN_PAGE_BYTES = 1 << 20
"""The most key bytes in one plan page: far under a document's 16 MiB."""
RUNS = {PLAN_OF: {"$exists": False}}
"""The filter of run documents (not plan pages) in the run collection."""


def plan_pages(rebuild_id: str, keys: Sequence[str],
               page_bytes: int = PLAN_PAGE_BYTES) -> list[dict[str, Any]]:
    """A rebuild's frozen plan as page documents (``_id`` ``ID#plan.N``), in plan order.

    The plan is kept beside its run document so ``--resume`` runs exactly the
    keys, in exactly the order, the first run planned: a query re-run later
    may also match events that finished since and, ordered ones joining their
    entity's group, move a group before the checkpoint's last key.
    """
    pages: list[list[str]] = [[]]
    size = 0
    for key in keys:
        if pages[-1] and size + len(key) > page_bytes:
            pages.append([])
            size = 0
        pages[-1].append(key)
        size += len(key)
    return [{"_id": f"{rebuild_id}#plan.{number:06d}", PLAN_OF: rebuild_id, "page": number,
             "keys": page} for number, page in enumerate(pages)]


def run_document(run: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A rebuild's run document as stored (``_id`` the rebuild id), stamped ``updated_at``."""
    return {**dict(run), "_id": str(run["rebuild_id"]), "updated_at": now}
