"""Entity records: the applied position of an ordered handler's entity, and who holds it now.

An entity record lives in ``partner_events`` beside the events (so releasing
it rides in the same bulk write as its events' finish: one round trip), under
``entity:<hash>`` (``eventbus.model.order.entity_key``), marked
``record_type: "entity"`` and left out of every operator query of events::

    idempotency_key   "entity:<hash>"
    record_type       "entity"
    entity            {partnerId, entity_type, entity_id}
    position          the applied position (absent until one event applied)
    position_kind     its kind, "number" or "time" (absent on records stored before
                      kinds were: such a position compares with either kind, once)
    applied_key       the idempotency key of the event applied at it
    applied_at        BSON date of that SUCCESS
    holder            {owner, until, keys, positions} while a batch holds the entity
    orphan            {keys, positions} of a holder whose lease ran out unreleased, else null
    lastUpdatedTime   epoch-ms text

A take (``take_pipeline`` / ``entity_free``) holds a free entity, or one
whose holder's lease ran out (that holder's events join the ``orphan``: the
new holder reads their records and applies the newest that succeeded, so a
crash between an event's SUCCESS and its release never lets an older event
through). Orphans accumulate: a take adds the lapsed holder's keys to those
already there, so two crashes in a row lose nothing. A release
(``release_update``) is fenced (it matches only while its owner's hold
holds on the store's clock), moves the position only forward (a ``$max``),
and keeps the orphan keys whose records its holder did not see finished.
The position moves only over one of its own kind (``position_kind``, or an
untagged one): a number and a time are never ordered against each other, in
the store as in the lane (``eventbus.model.order.mismatch``).

A **hold** (``hold_filter`` / ``hold_update``, an upsert) is the take's cheap
form, for the common cases only, sent in the claim's own write command: it
inserts a new entity held, or holds an existing one that nobody holds and
whose applied position is at most the lowest position of the take and of
the take's one kind, or untagged (so none of the take's events is stale or
of another kind, and no orphan exists: a release unsets both). A take of
mixed kinds holds this way only an entity with no position or an untagged one.
Any other entity (held, expired holder, ahead) makes the upsert's insert fail
on the unique key, and is taken the full way (``take_pipeline``) after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Shift, lease_end, store_now
from eventbus.store.documents.records import EPOCH, bson_time, epoch_ms
from eventbus.store.documents.updates import beat, guarded, lease_live, live

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
        "holder": {"owner": owner, "until": lease_end(now, lease),
                   "keys": list(keys), "positions": list(positions)},
        "lastUpdatedTime": epoch_ms(now), "orphan": (record or {}).get("orphan")}
    if isinstance(previous, Mapping) and previous.get("owner"):
        fields["orphan"] = orphaned(fields["orphan"], previous)
    return fields


def orphaned(orphan: Any, holder: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``orphan`` with a lapsed ``holder``'s keys and positions added (they accumulate)."""
    kept = orphan if isinstance(orphan, Mapping) else {}
    return {"keys": [*(kept.get("keys") or []), *(holder.get("keys") or [])],
            "positions": [*(kept.get("positions") or []), *(holder.get("positions") or [])]}


def take_pipeline(entity: Mapping[str, Any], owner: str, now: datetime, lease: timedelta,
                  keys: Sequence[str], positions: Sequence[Any],
                  shift: Shift | None = None) -> list[dict[str, Any]]:
    """The update pipeline of a take (an upsert): hold the entity when it is free.

    Free: nobody holds it, or its holder's ``until`` is before the store's now.
    """
    free = {"$or": [{"$eq": [{"$ifNull": ["$holder.owner", None]}, None]},
                    {"$lt": [{"$ifNull": ["$holder.until", EPOCH]}, store_now(shift)]}]}
    holder = {"owner": owner, "until": store_now(shift, lease), "keys": {"$literal": list(keys)},
              "positions": {"$literal": list(positions)}}
    joined = {"keys": {"$concatArrays": [{"$ifNull": ["$orphan.keys", []]},
                                         {"$ifNull": ["$holder.keys", []]}]},
              "positions": {"$concatArrays": [{"$ifNull": ["$orphan.positions", []]},
                                              {"$ifNull": ["$holder.positions", []]}]}}
    orphan = {"$cond": [{"$eq": [{"$ifNull": ["$holder.owner", None]}, None]},
                        {"$ifNull": ["$orphan", None]}, joined]}
    return [{"$set": {"__eventbus_free": free}},
            {"$set": {RECORD_TYPE: ENTITY,
                      "entity": {"$ifNull": ["$entity", {"$literal": dict(entity)}]},
                      "orphan": {"$cond": ["$__eventbus_free", orphan,
                                           {"$ifNull": ["$orphan", None]}]},
                      "holder": {"$cond": ["$__eventbus_free", holder, "$holder"]},
                      "lastUpdatedTime": {"$cond": ["$__eventbus_free", epoch_ms(now),
                                                    "$lastUpdatedTime"]}}},
            {"$unset": ["__eventbus_free"]}]


def hold_filter(entity_key: str, lowest: Any, kind: str = "") -> dict[str, Any]:
    """Match the entity only when nobody holds it and its position is at most ``lowest``,
    untagged or of ``kind`` (the take's one kind; "" when mixed: untagged only).

    Not an equality on the key alone, so a store never retries the upsert's
    duplicate key (MongoDB retries only queries of equalities on exactly the
    unique index's fields): the error is the answer "not held by this hold".
    """
    # The lane never sees a held record's position (``held_record``), so it must be
    # one every event of the take compares with: untagged, or of the take's one kind.
    below = [{"position": {"$lte": lowest}, "position_kind": {"$exists": False}},
             *([{"position": {"$lte": lowest}, "position_kind": kind}] if kind else [])]
    return {"idempotency_key": entity_key, "holder": {"$exists": False}, "orphan": None,
            "$or": [{"position": {"$exists": False}}, *below]}


def holdable(record: Mapping[str, Any] | None, lowest: Any, kind: str = "") -> bool:
    """True when a hold holds the entity of ``record`` (None: new). Mirrors ``hold_filter``."""
    if record is None:
        return True
    position = record.get("position")
    return "holder" not in record and record.get("orphan") is None and \
        (position is None or (position <= lowest and (
            "position_kind" not in record or (bool(kind) and record["position_kind"] == kind))))


def hold_update(entity: Mapping[str, Any], owner: str, now: datetime, lease: timedelta,
                keys: Sequence[str], positions: Sequence[Any],
                shift: Shift | None = None) -> list[dict[str, Any]]:
    """The update of a hold (an upsert under ``hold_filter``): set the holder.

    A pipeline, so the hold ends at the store's now plus ``lease``.
    """
    return [{"$set": {"holder": {"owner": owner, "until": store_now(shift, lease),
                                 "keys": {"$literal": list(keys)},
                                 "positions": {"$literal": list(positions)}},
                      "lastUpdatedTime": epoch_ms(now),
                      RECORD_TYPE: {"$ifNull": [f"${RECORD_TYPE}", ENTITY]},
                      "entity": {"$ifNull": ["$entity", {"$literal": dict(entity)}]}}}]


def held_record(entity_key: str, entity: Mapping[str, Any], owner: str, now: datetime,
                lease: timedelta, keys: Sequence[str], positions: Sequence[Any]) -> dict[str, Any]:
    """The record a hold (or the insert of a new entity) leaves, as far as its holder needs it.

    Its applied position is left out: a hold matched only an entity at or
    below the take's lowest position, so no event of the take is stale.
    """
    return {"idempotency_key": entity_key,
            **taken_fields(None, entity, owner, now, lease, keys, positions)}


def holder_filter(entity_key: str, owner: str) -> dict[str, Any]:
    """The filter that matches the entity while ``owner`` is its holder (the writes that use
    it check, on the server's clock, that the hold has not run out: ``_HELD``)."""
    return {"idempotency_key": entity_key, "holder.owner": owner}


_HELD = "$holder.until"
"""The field ``live`` reads for a hold."""


def held_by(record: Mapping[str, Any] | None, owner: str, now: datetime) -> bool:
    """True while ``owner``'s hold on ``record`` holds at ``now``. Mirrors ``holder_filter``."""
    holder = (record or {}).get("holder")
    return isinstance(holder, Mapping) and holder.get("owner") == owner and \
        lease_live(holder.get("until"), now)


def hold_renewal(lease: timedelta, shift: Shift | None = None) -> list[dict[str, Any]]:
    """The update that extends a hold that still holds to the store's now plus ``lease``."""
    return guarded([{"$set": {"holder.until": store_now(shift, lease),
                              "holder.beats": beat("holder.beats")}}], live(_HELD, shift))


def release_update(now: datetime, position: Any = None, applied_key: str = "",
                   orphan: Mapping[str, Sequence[Any]] | None = None,
                   shift: Shift | None = None, kind: str = "") -> list[dict[str, Any]]:
    """Free the entity; with ``applied_key``, store ``position`` as applied unless one is ahead.

    The position only moves forward (a newer SUCCESS another holder stored
    stays), and only over one of ``kind`` (or untagged; ``kind`` "": untagged
    too), which it then tags; ``orphan``: the orphan keys whose records the
    holder did not see finished, kept for the next holder (None or empty: none left).
    """
    done: dict[str, Any] = {"lastUpdatedTime": epoch_ms(now)}
    if applied_key:
        # BSON orders a number and a date-like number alike: the kind says which is which.
        same: Any = {"$in": [{"$ifNull": ["$position_kind", ""]}, ["", kind]]} if kind else True
        ahead = {"$or": [{"$eq": [{"$ifNull": ["$position", None]}, None]},
                         {"$and": [same, {"$gt": [{"$literal": position}, "$position"]}]}]}
        done.update({"position": {"$cond": [ahead, {"$literal": position}, "$position"]},
                     "applied_key": {"$cond": [ahead, applied_key, "$applied_key"]},
                     "applied_at": {"$cond": [ahead, bson_time(now), "$applied_at"]}})
        if kind:
            done["position_kind"] = {"$cond": [ahead, kind, "$position_kind"]}
    left = orphan if orphan and orphan.get("keys") else None
    if left is not None:
        done["orphan"] = {"$literal": {"keys": list(left["keys"]),
                                       "positions": list(left.get("positions") or [])}}
    return guarded([{"$set": done},
                    {"$unset": ["holder", *([] if left is not None else ["orphan"])]}],
                   live(_HELD, shift))


def released(record: dict[str, Any], now: datetime, position: Any = None,
             applied_key: str = "", orphan: Mapping[str, Sequence[Any]] | None = None,
             kind: str = "") -> None:
    """Apply ``release_update`` to ``record`` in place (the in-memory store's form)."""
    record["lastUpdatedTime"] = epoch_ms(now)
    current = record.get("position")
    same = not kind or record.get("position_kind", "") in ("", kind)
    if applied_key and (current is None or (same and position > current)):
        record.update(position=position, applied_key=applied_key, applied_at=bson_time(now))
        if kind:
            record["position_kind"] = kind
    record.pop("holder", None)
    if orphan and orphan.get("keys"):
        record["orphan"] = {"keys": list(orphan["keys"]),
                            "positions": list(orphan.get("positions") or [])}
    else:
        record.pop("orphan", None)
