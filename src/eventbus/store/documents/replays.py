"""A rebuild's marks on the event records: its lease, what a replay's finish writes, what it made.

A rebuild (``eventbus.rebuild``) leases the records it runs again (``LEASE``,
fenced against live claims as a live lease is), appends its audit entry to
``replays`` and its new children to ``outbox`` when it finishes, and marks the
records it made (``MADE``). These are event-collection facts, built here for the
event store's replay primitives (``RebuildStore``); the rebuild's own documents
(its runs and plans) are ``eventbus.rebuild.documents``.
"""


from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Shift, lease_end, store_now
from eventbus.store.documents.entities import is_entity
from eventbus.store.documents.records import (
    PENDING,
    PROCESSING,
    REBUILD_MADE,
    SUCCESS,
    epoch_ms,
)
from eventbus.store.documents.updates import guarded, lease_live, live

LEASE = "rebuild_lease"
"""The field of a rebuild's lease on a record: ``{owner, until}``."""


MADE = REBUILD_MADE
"""The field naming the rebuild that made a record (``records.REBUILD_MADE``)."""


def made_unfinished(record: Mapping[str, Any] | None) -> bool:
    """True for a record a rebuild made that no rebuild finished yet (PENDING or PROCESSING).

    Nothing but a rebuild runs it (the redrive leaves it out); a rebuild that
    meets it (``--resume``, or ``--keys`` naming it) claims it again as a new
    record through the live claim, which takes it once its lease lapsed on the
    store's clock.
    """
    return record is not None and record.get(MADE) is not None and \
        record.get("event_status") in (PENDING, PROCESSING)


def rebuilt_by(record: Mapping[str, Any], rebuild_id: str) -> bool:
    """True when ``record`` has an audit entry of rebuild ``rebuild_id`` (it ran already)."""
    entries = record.get("replays")
    return isinstance(entries, list) and any(
        isinstance(entry, Mapping) and entry.get("rebuild") == rebuild_id for entry in entries)


def rebuildable(record: Mapping[str, Any] | None, rebuild_id: str, now: datetime) -> bool:
    """True when rebuild ``rebuild_id`` may lease ``record`` at ``now`` (the memory form)."""
    if record is None or is_entity(record) or record.get("event_status") != SUCCESS:
        return False
    if record.get("stale") or rebuilt_by(record, rebuild_id):
        return False
    lease = record.get(LEASE)
    return not (isinstance(lease, Mapping) and lease_live(lease.get("until"), now))


def rebuild_claim_filter(keys: Collection[str], rebuild_id: str) -> dict[str, Any]:
    """The indexed half of the rule: SUCCESS, not stale, not rebuilt by this rebuild."""
    return {"idempotency_key": {"$in": list(keys)}, "event_status": SUCCESS,
            "stale": {"$exists": False}, "replays.rebuild": {"$ne": rebuild_id}}


def rebuild_claim_update(owner: str, lease: timedelta,
                         shift: Shift | None = None) -> list[dict[str, Any]]:
    """The other half, on the store's clock: no live rebuild lease; then lease it to ``owner``."""
    return guarded([{"$set": {LEASE: {"owner": owner, "until": store_now(shift, lease)}}}],
                   {"$not": [live(f"${LEASE}.until", shift)]})


def rebuild_lease(owner: str, now: datetime, lease: timedelta) -> dict[str, Any]:
    """The lease field a claim at the store's ``now`` sets (the memory form)."""
    return {"owner": owner, "until": lease_end(now, lease)}


def rebuild_held(record: Mapping[str, Any] | None, owner: str, now: datetime) -> bool:
    """True while ``owner``'s rebuild lease on ``record`` holds at ``now``."""
    lease = (record or {}).get(LEASE)
    return isinstance(lease, Mapping) and lease.get("owner") == owner and \
        lease_live(lease.get("until"), now)


def rebuild_owner_filter(key: str, owner: str) -> dict[str, Any]:
    """The filter of a write under ``owner``'s rebuild lease on ``key``."""
    return {"idempotency_key": key, f"{LEASE}.owner": owner}


def rebuild_renew_update(lease: timedelta, shift: Shift | None = None) -> list[dict[str, Any]]:
    """Extend a live rebuild lease to the store's now plus ``lease``; a lapsed one stays lapsed."""
    return guarded([{"$set": {f"{LEASE}.until": store_now(shift, lease)}}],
                   live(f"${LEASE}.until", shift))


def rebuild_finish_update(entry: Mapping[str, Any] | None, outbox: Sequence[Mapping[str, Any]],
                          now: datetime, shift: Shift | None = None) -> list[dict[str, Any]]:
    """Append the audit ``entry`` and the new ``outbox`` entries, drop the lease; fenced.

    ``entry`` None gives the lease back untouched (the event goes back to the
    rebuild: its entity was busy). The status is never written.
    """
    done: dict[str, Any] = {}
    if entry is not None:
        done["replays"] = {"$concatArrays": [{"$ifNull": ["$replays", []]},
                                             [{"$literal": dict(entry)}]]}
        done["lastUpdatedTime"] = {"$literal": epoch_ms(now)}
    if outbox:
        done["outbox"] = {"$concatArrays": [{"$ifNull": ["$outbox", []]},
                                            [{"$literal": dict(child)} for child in outbox]]}
    stages: list[dict[str, Any]] = [{"$set": done}] if done else []
    stages.append({"$unset": [LEASE]})
    return guarded(stages, live(f"${LEASE}.until", shift))


def rebuild_finished(record: dict[str, Any], entry: Mapping[str, Any] | None,
                     outbox: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Apply ``rebuild_finish_update`` to ``record`` in place (the memory form)."""
    if entry is not None:
        record["replays"] = [*(record.get("replays") or []), dict(entry)]
        record["lastUpdatedTime"] = epoch_ms(now)
    if outbox:
        record["outbox"] = [*(record.get("outbox") or []), *(dict(c) for c in outbox)]
    record.pop(LEASE, None)
