"""Effects shared by the domain handlers: projections and partner notifications."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo.errors import DuplicateKeyError

from eventbus.context import Context
from eventbus.errors import PermanentError

NOTIFICATIONS = "partner_notifications"


def apply_projection(context: Context, collection: str, doc_id: str, as_of: float,
                     state: Mapping[str, Any]) -> bool:
    """Set ``state`` on a projection unless a newer event already did; True if applied.

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
        context.log.info("stale event for %s %s ignored", collection, doc_id)
        return False
    return True


def record_notification(context: Context, kind: str, payload: Mapping[str, Any]) -> None:
    """Record, once per event, a notification to send to the partner."""
    meta = context.event.entity_metadata
    document = {"_id": f"{context.key}#{kind}", "kind": kind, "partnerId": meta.partner_id,
                "partnerName": meta.partner_name, "entity_id": meta.entity_id,
                "payload": dict(payload), "status": "PENDING", "created": context.now()}
    try:
        context.db[NOTIFICATIONS].insert_one(document)
    except DuplicateKeyError:
        context.log.info("notification %s already recorded", document["_id"])


def require(data: Mapping[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``data[field]`` if it has type ``kind``; a payload without it can never succeed."""
    value = data.get(field)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise PermanentError(f"entity_data.{field} is missing or not {_name(kind)}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
