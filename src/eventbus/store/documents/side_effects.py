"""The side-effect guard's records: take a lease on a key, finish it once."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.store.documents.claims import lease_expired
from eventbus.store.documents.records import FAILED, PROCESSING, SUCCESS, bson_time


def guard_take_filter(key: str, now: datetime) -> dict[str, Any]:
    """Return the filter that matches side effect ``key`` only when it may be leased at ``now``."""
    return {"_id": key, "status": {"$ne": SUCCESS},
            "$or": [{"lease_until": {"$exists": False}}, {"lease_until": {"$lt": bson_time(now)}}]}


def guard_takeable(record: Mapping[str, Any] | None, now: datetime) -> bool:
    """Return True when a guard record may be leased at ``now`` (``guard_take_filter``)."""
    if record is None:
        return True
    if record.get("status") == SUCCESS:
        return False
    return lease_expired(record.get("lease_until"), now)


def guard_take_update(now: datetime, owner: str, lease: timedelta) -> dict[str, Any]:
    """Return the upsert that takes a side effect's lease (and creates its record once)."""
    moment = bson_time(now)
    return {"$set": {"status": PROCESSING, "lease_owner": owner,
                     "lease_until": bson_time(moment + lease), "updated_at": moment},
            "$inc": {"attempts": 1},
            "$setOnInsert": {"created_at": moment}}


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
