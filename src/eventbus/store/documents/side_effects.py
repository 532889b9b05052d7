"""The side-effect guard's records: take a lease on a key, finish it once."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Shift, lease_end, store_now
from eventbus.store.documents.claims import lease_expired
from eventbus.store.documents.records import EPOCH, FAILED, PROCESSING, SUCCESS, bson_time
from eventbus.store.documents.updates import beat, guarded, live


def guard_takeable(record: Mapping[str, Any] | None, now: datetime) -> bool:
    """Return True when a guard record may be leased at the store's ``now`` (``guard_take``)."""
    if record is None:
        return True
    if record.get("status") == SUCCESS:
        return False
    return lease_expired(record.get("lease_until"), now)


def guard_take(now: datetime, owner: str, lease: timedelta,
               shift: Shift | None = None) -> list[dict[str, Any]]:
    """The upsert pipeline that takes a side effect's lease when it may, on the store's clock.

    Taken: no record, or not SUCCESS and its lease ran out before the
    store's now. The result says who holds it (``lease_owner``).
    """
    take = {"$and": [{"$ne": [{"$ifNull": ["$status", ""]}, SUCCESS]},
                     {"$lt": [{"$ifNull": ["$lease_until", EPOCH]}, store_now(shift)]}]}
    moment = bson_time(now)
    taken = guarded([{"$set": {"status": PROCESSING, "lease_owner": owner,
                               "lease_until": store_now(shift, lease), "updated_at": moment,
                               "attempts": beat("attempts")}}], take)
    return [*taken, {"$set": {"created_at": {"$ifNull": ["$created_at", moment]}}}]


def guard_taken(record: Mapping[str, Any] | None, now: datetime, owner: str,
                lease: timedelta) -> dict[str, Any]:
    """The record ``guard_take`` leaves on a takeable ``record`` (the in-memory store's form)."""
    moment = bson_time(now)
    return {**(record or {}), "status": PROCESSING, "lease_owner": owner,
            "lease_until": lease_end(now, lease), "updated_at": moment,
            "attempts": int((record or {}).get("attempts") or 0) + 1,
            "created_at": (record or {}).get("created_at", moment)}


def guard_renewal(key: str, owner: str, lease: timedelta,
                  shift: Shift | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Filter and update that extend ``owner``'s guard lease while it still holds."""
    return ({"_id": key, "lease_owner": owner, "status": PROCESSING},
            guarded([{"$set": {"lease_until": store_now(shift, lease),
                               "lease_beats": beat("lease_beats")}}],
                    live("$lease_until", shift)))


def guard_owner_filter(key: str, owner: str, succeeded: bool) -> dict[str, Any]:
    """Return the filter of ``guard_finish``.

    A success is stored whoever holds the lease now: the effect happened, and
    the key must be set for good. A failure only releases the caller's own lease.
    """
    return {"_id": key} if succeeded else {"_id": key, "lease_owner": owner}


def guard_finish_update(now: datetime, *, succeeded: bool,
                        result: Mapping[str, Any]) -> dict[str, Any]:
    """Return the update that ends a lease: SUCCESS with the result, or FAILED with the error."""
    moment = bson_time(now)
    done: dict[str, Any] = {"status": SUCCESS if succeeded else FAILED, "updated_at": moment,
                            **({"result": dict(result)} if succeeded else {"error": dict(result)})}
    if succeeded:
        done["done_at"] = moment
    return {"$set": done, "$unset": {"lease_until": "", "lease_owner": "",
                                     **({"error": ""} if succeeded else {})}}
