"""Effects shared by the domain handlers: projections and payload checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo.errors import DuplicateKeyError

from eventbus import Context, PermanentError


def apply_projection(context: Context, collection: str, doc_id: str, as_of: float,
                     state: Mapping[str, Any]) -> bool:
    """Set ``state`` on a projection unless a newer event already did.

    Return True when this event's state is applied, now or by an earlier
    attempt of the same event: a retried handler must take the same
    decisions (emit the same children) as the attempt that applied it.

    Events may arrive out of order, so each projection keeps the timestamp of
    the state it shows and refuses older ones. The history records which
    event changed it, which makes a double application visible.
    """
    newer = {"_id": doc_id, "$or": [{"asOf": {"$lt": as_of}}, {"asOf": {"$exists": False}}]}
    change = {"$set": {**state, "asOf": as_of, "updatedBy": context.key},
              "$push": {"history": {"key": context.key, "asOf": as_of, **state}},
              "$inc": {"eventsApplied": 1}}
    try:
        context.db[collection].update_one(newer, change, upsert=True)
    except DuplicateKeyError:
        if context.db[collection].count_documents({"_id": doc_id, "history.key": context.key}):
            return True
        context.log.info("stale event for %s %s ignored", collection, doc_id)
        return False
    return True


def require(data: Mapping[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``data[field]`` if it has type ``kind``; a payload without it can never succeed."""
    value = data.get(field)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise PermanentError(f"entity_data.{field} is missing or not {_name(kind)}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
