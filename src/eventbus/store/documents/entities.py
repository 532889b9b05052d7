"""Entity records: the applied position of an ordered handler's entity, and who holds it now.

An entity record lives in ``partner_events`` beside the events (so releasing
it rides in the same bulk write as its events' finish: one round trip), under
``entity:<hash>`` (``eventbus.model.order.entity_key``), marked
``record_type: "entity"`` and left out of every operator query of events::

    idempotency_key   "entity:<hash>"
    record_type       "entity"
    entity            {partnerId, entity_type, entity_id}
    position          the applied position (absent until one event applied)
    applied_key       the idempotency key of the event applied at it
    applied_at        BSON date of that SUCCESS
    holder            {owner, until, keys, positions} while a batch holds the entity
    orphan            {keys, positions} of a holder whose lease ran out unreleased, else null
    lastUpdatedTime   epoch-ms text

A take (``take_pipeline`` / ``entity_free``) holds a free entity, or one
whose holder's lease ran out (that holder's events become the ``orphan``: the
new holder reads their records and applies the newest that succeeded, so a
crash between an event's SUCCESS and its release never lets an older event
through). A release (``release_update``) stores the new position and frees it.

A **hold** (``hold_filter`` / ``hold_update``, an upsert) is the take's cheap
form, for the common cases only, sent in the claim's own write command: it
inserts a new entity held, or holds an existing one that nobody holds and
whose applied position is at most the lowest position of the take (so none
of the take's events is stale, and no orphan exists: a release unsets both).
Any other entity (held, expired holder, ahead) makes the upsert's insert fail
on the unique key, and is taken the full way (``take_pipeline``) after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.store.documents.records import bson_time, epoch_ms

ENTITY = "entity"
RECORD_TYPE = "record_type"
NOT_ENTITY = {RECORD_TYPE: {"$ne": ENTITY}}
"""The filter term every operator query of events adds."""


def is_entity(record: Mapping[str, Any]) -> bool:
    """True for an entity record (never an event)."""
    return record.get(RECORD_TYPE) == ENTITY


def entity_free(record: Mapping[str, Any] | None, now: datetime) -> bool:
    """True when a take at ``now`` holds the entity. Mirrors ``take_pipeline``'s ``free``."""
    holder = (record or {}).get("holder")
    if not isinstance(holder, Mapping) or not holder.get("owner"):
        return True
    until = holder.get("until")
    return not isinstance(until, datetime) or bson_time(until) < bson_time(now)


def taken_fields(record: Mapping[str, Any] | None, entity: Mapping[str, Any], owner: str,
                 now: datetime, lease: timedelta, keys: Sequence[str],
                 positions: Sequence[Any]) -> dict[str, Any]:
    """The fields a take sets on a free entity (the in-memory store's form of the pipeline)."""
    previous = (record or {}).get("holder")
    fields: dict[str, Any] = {
        RECORD_TYPE: ENTITY, "entity": dict((record or {}).get("entity") or entity),
        "holder": {"owner": owner, "until": bson_time(bson_time(now) + lease),
                   "keys": list(keys), "positions": list(positions)},
        "lastUpdatedTime": epoch_ms(now), "orphan": None}
    if isinstance(previous, Mapping) and previous.get("owner"):
        fields["orphan"] = {"keys": list(previous.get("keys") or []),
                            "positions": list(previous.get("positions") or [])}
    return fields


def take_pipeline(entity: Mapping[str, Any], owner: str, now: datetime, lease: timedelta,
                  keys: Sequence[str], positions: Sequence[Any]) -> list[dict[str, Any]]:
    """The update pipeline of a take (an upsert): hold the entity when it is free."""
    now = bson_time(now)
    free = {"$or": [{"$eq": [{"$ifNull": ["$holder.owner", None]}, None]},
                    {"$lt": [{"$ifNull": ["$holder.until", bson_time(now - lease)]}, now]}]}
    holder = {"owner": owner, "until": bson_time(now + lease), "keys": {"$literal": list(keys)},
              "positions": {"$literal": list(positions)}}
    orphan = {"$cond": [{"$eq": [{"$ifNull": ["$holder.owner", None]}, None]}, None,
                        {"keys": "$holder.keys", "positions": "$holder.positions"}]}
    return [{"$set": {"__eventbus_free": free}},
            {"$set": {RECORD_TYPE: ENTITY,
                      "entity": {"$ifNull": ["$entity", {"$literal": dict(entity)}]},
                      "orphan": {"$cond": ["$__eventbus_free", orphan, "$orphan"]},
                      "holder": {"$cond": ["$__eventbus_free", holder, "$holder"]},
                      "lastUpdatedTime": {"$cond": ["$__eventbus_free", epoch_ms(now),
                                                    "$lastUpdatedTime"]}}},
            {"$unset": ["__eventbus_free"]}]


def hold_filter(entity_key: str, lowest: Any) -> dict[str, Any]:
    """Match the entity only when nobody holds it and its position is at most ``lowest``.

    Not an equality on the key alone, so a store never retries the upsert's
    duplicate key (MongoDB retries only queries of equalities on exactly the
    unique index's fields): the error is the answer "not held by this hold".
    """
    return {"idempotency_key": entity_key, "holder": {"$exists": False},
            "$or": [{"position": {"$exists": False}}, {"position": {"$lte": lowest}}]}


def holdable(record: Mapping[str, Any] | None, lowest: Any) -> bool:
    """True when a hold holds the entity of ``record`` (None: new). Mirrors ``hold_filter``."""
    if record is None:
        return True
    position = record.get("position")
    return "holder" not in record and (position is None or position <= lowest)


def hold_update(entity: Mapping[str, Any], owner: str, now: datetime, lease: timedelta,
                keys: Sequence[str], positions: Sequence[Any]) -> dict[str, Any]:
    """The update of a hold (an upsert under ``hold_filter``): set the holder."""
    now = bson_time(now)
    return {"$set": {"holder": {"owner": owner, "until": bson_time(now + lease),
                                "keys": list(keys), "positions": list(positions)},
                     "lastUpdatedTime": epoch_ms(now)},
            "$setOnInsert": {RECORD_TYPE: ENTITY, "entity": dict(entity)}}


def held_record(entity_key: str, entity: Mapping[str, Any], owner: str, now: datetime,
                lease: timedelta, keys: Sequence[str], positions: Sequence[Any]) -> dict[str, Any]:
    """The record a hold (or the insert of a new entity) leaves, as far as its holder needs it.

    Its applied position is left out: a hold matched only an entity at or
    below the take's lowest position, so no event of the take is stale.
    """
    return {"idempotency_key": entity_key,
            **taken_fields(None, entity, owner, now, lease, keys, positions)}


def holder_filter(entity_key: str, owner: str) -> dict[str, Any]:
    """The filter that matches the entity only while ``owner`` holds it."""
    return {"idempotency_key": entity_key, "holder.owner": owner}


def release_update(now: datetime, position: Any = None,
                   applied_key: str = "") -> dict[str, Any]:
    """Free the entity; with ``position``, store it as applied (by ``applied_key``)."""
    done: dict[str, Any] = {"lastUpdatedTime": epoch_ms(now)}
    if applied_key:
        done.update(position=position, applied_key=applied_key, applied_at=bson_time(now))
    return {"$set": done, "$unset": {"holder": "", "orphan": ""}}
