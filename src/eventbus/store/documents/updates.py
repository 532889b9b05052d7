"""The writes that move a claimed record on: renew, succeed, fail, reject, redrive, abandon.

Every write made under a lease is fenced: it matches only its owner's record
(``owner_filter``) and takes effect only while the lease has not run out on
the store's clock (``guarded(update, live(...))``, ``$$NOW`` inside the
pipeline); a lapsed lease is LEASE_LOST even if nobody took it yet. The
sweepers' writes decide "stale" the same way; the memory store's Python
mirrors (``lease_live``, ``stale``) read its own clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Shift, lease_end, store_now
from eventbus.store.documents.claims import is_rejected
from eventbus.store.documents.records import (
    DELIVERY_COUNT,
    EPOCH,
    FAILED,
    NOT_BEFORE,
    PENDING,
    PROCESSING,
    REBUILD_MADE,
    REJECTED,
    SUCCESS,
    bson_time,
    epoch_ms,
    insert_fields,
)


def key_filter(key: str) -> dict[str, Any]:
    """Return the filter that finds the record of ``key``."""
    return {"idempotency_key": key}


def owner_filter(key: str, owner: str) -> dict[str, Any]:
    """Return the filter that matches ``key`` while ``owner`` is its lease's owner.

    The other half of the fence, that the lease has not run out on the
    store's clock, is decided inside the write (``guarded(update, live(...))``):
    a server may not evaluate ``$$NOW`` in an indexed filter, and a
    pipeline always can.
    """
    return {"idempotency_key": key, "lease_owner": owner, "event_status": PROCESSING}


_FLAG = "__eventbus_fence"
_IF_FENCE = f"${_FLAG}"


def guarded(update: Mapping[str, Any] | Sequence[Mapping[str, Any]],
            condition: Any) -> list[dict[str, Any]]:
    """``update`` as a pipeline that changes the document only when ``condition`` holds.

    ``condition`` is evaluated on the document as it was (first stage); every
    field set, unset or incremented keeps its value when it is false, so the
    write's ``modified_count`` says whether it took. ``update`` is a classic
    update (``$set``, ``$unset``, ``$inc``) or a pipeline of ``$set``/``$unset``
    stages.
    """
    stages = _stages(update)
    out: list[dict[str, Any]] = [{"$set": {_FLAG: condition}}]
    for stage in stages:
        if "$set" in stage:
            out.append({"$set": {name: {"$cond": [_IF_FENCE, value, "$" + name]}
                                 for name, value in stage["$set"].items()}})
        else:
            names = stage["$unset"]
            out.append({"$set": {name: {"$cond": [_IF_FENCE, "$$REMOVE", "$" + name]}
                                 for name in ([names] if isinstance(names, str) else names)}})
    out.append({"$unset": [_FLAG]})
    return out


def _stages(update: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if not isinstance(update, Mapping):
        return list(update)
    stages: list[Mapping[str, Any]] = []
    if "$set" in update:
        stages.append({"$set": {name: {"$literal": value}
                                for name, value in update["$set"].items()}})
    if "$inc" in update:
        stages.append({"$set": {name: {"$add": [{"$ifNull": [f"${name}", 0]}, by]}
                                for name, by in update["$inc"].items()}})
    if "$unset" in update:
        stages.append({"$unset": list(update["$unset"])})
    return stages


def beat(name: str) -> dict[str, Any]:
    """A counter a renewal bumps, so a renewal that took always changes the document."""
    return {"$add": [{"$ifNull": [f"${name}", 0]}, 1]}


def live(until: str, shift: Shift | None = None) -> dict[str, Any]:
    """The expression that a lease or hold ending at field ``until`` still holds (store's clock)."""
    return {"$gt": [{"$ifNull": [until, EPOCH]}, store_now(shift)]}


def lease_live(until: Any, now: datetime) -> bool:
    """True while a lease or hold ending at ``until`` holds at ``now``. Mirrors ``live``."""
    return isinstance(until, datetime) and bson_time(until) > bson_time(now)


def holds(record: Mapping[str, Any] | None, owner: str, now: datetime) -> bool:
    """True while ``owner``'s lease on ``record`` holds at ``now`` (``owner_filter``, ``live``)."""
    return record is not None and record.get("lease_owner") == owner and \
        record.get("event_status") == PROCESSING and lease_live(record.get("lease_until"), now)


def renew_update(lease: timedelta, shift: Shift | None = None) -> list[dict[str, Any]]:
    """Return the update that extends a held lease to the store's now plus ``lease``.

    Fenced (with ``owner_filter``): a lease that ran out is not brought back.
    """
    return guarded([{"$set": {"lease_until": store_now(shift, lease),
                              "lease_beats": beat("lease_beats")}}],
                   live("$lease_until", shift))


def renewed(lease: timedelta, now: datetime) -> dict[str, Any]:
    """The fields a renewal sets at the store's ``now`` (the memory store's form)."""
    return {"lease_until": lease_end(now, lease)}


def succeed_update(now: datetime, outbox: Sequence[Mapping[str, Any]] = (),
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the update that marks a claimed record SUCCESS, with its children if any."""
    done: dict[str, Any] = {**(extra or {}), "event_status": SUCCESS,
                            "lastUpdatedTime": epoch_ms(now)}
    if outbox:
        done["outbox"] = [dict(child) for child in outbox]
    return {"$set": done, "$unset": {"lease_until": "", "lease_owner": ""}}


def unclaim_update(now: datetime, redrive_at: datetime | None = None) -> dict[str, Any]:
    """Return the update that gives a claim back: PENDING again, its attempt returned.

    For an ordered event whose entity another worker holds: nothing ran, so
    nothing is spent; the next claim takes the same attempt number again.
    ``redrive_at``: when the store's redrive publishes it again if the broker
    never brings it back (a PENDING record is redriven like a FAILED one).
    """
    done: dict[str, Any] = {"event_status": PENDING, "lastUpdatedTime": epoch_ms(now)}
    if redrive_at is not None:
        done["redrive_at"] = bson_time(redrive_at)
    return {"$set": done, "$unset": {"lease_until": "", "lease_owner": ""},
            "$inc": {"attempts": -1}}


def finish_update(finish: Any, now: datetime) -> dict[str, Any]:
    """Return the update that stores one ``store.base.Finish`` (SUCCESS, FAILED, or unclaimed)."""
    if finish.unclaim:
        return unclaim_update(now, finish.redrive_at)
    if finish.error is None:
        return succeed_update(now, finish.outbox, finish.extra)
    update = fail_update(now, finish.error, retryable=finish.retryable,
                         redrive_at=finish.redrive_at, not_before=finish.not_before)
    if finish.extra:  # a new record a rebuild failed keeps its audit entry
        update["$set"] = {**dict(finish.extra), **update["$set"]}
    if finish.parked:  # counted where no claim erases it (``partner_documents.parks``)
        update["$inc"] = {PARKS: 1}
    return update


def fail_fields(now: datetime, error: Mapping[str, Any], *, retryable: bool,
                redrive_at: datetime | None = None,
                not_before: datetime | None = None) -> dict[str, Any]:
    """Return the fields a FAILED record gets; ``redrive_at`` when the store finishes its retry,
    ``not_before`` when no claim may take it sooner (a deferral, ``NOT_BEFORE``)."""
    fields = {"event_status": FAILED, "retryable": retryable, "error": dict(error),
              "lastUpdatedTime": epoch_ms(now)}
    if retryable and redrive_at is not None:
        fields["redrive_at"] = bson_time(redrive_at)
    if retryable and not_before is not None:
        fields[NOT_BEFORE] = bson_time(not_before)
    return fields


def fail_update(now: datetime, error: Mapping[str, Any], *, retryable: bool,
                redrive_at: datetime | None = None,
                not_before: datetime | None = None) -> dict[str, Any]:
    """Return the update that marks a claimed record FAILED, retryable or for good."""
    return {"$set": fail_fields(now, error, retryable=retryable, redrive_at=redrive_at,
                                not_before=not_before),
            "$unset": {"lease_until": "", "lease_owner": ""}}


def redrive_filter(now: datetime, lease: timedelta,
                   exclude: Collection[str] = ()) -> dict[str, Any]:
    """Return the filter of records the store must have delivered again at ``now``.

    ``now`` is the store's clock as last read (``store.now()``): a read, so an
    index-friendly comparison; the writes that follow (``mark_redriven``,
    ``abandon``) decide again on the server's own clock. FAILED-retryable and
    PENDING (handed back) records whose ``redrive_at`` has come (a PENDING one
    without it at once), and PROCESSING records whose lease ran out a lease
    ago or more (their worker died) unless a redrive is scheduled later. Keys
    in ``exclude`` (already seen by this pass) are left out. Mirrors ``redrivable``.

    A PENDING or PROCESSING record a rebuild made (``REBUILD_MADE``) is never
    redriven: the live pipeline would run it with the live guard, and its
    partner calls were made in production already; the rebuild runs it (its
    ``--resume``). A plain equality on the field (null matches a missing one)
    leaves the index the query uses as it was.
    """
    moment = bson_time(now)
    unscheduled = {"$or": [{"redrive_at": {"$exists": False}}, {"redrive_at": None},
                           {"redrive_at": {"$lte": moment}}]}
    found: dict[str, Any] = {"$or": [
        {"event_status": FAILED, "retryable": True, "redrive_at": {"$lte": moment}},
        {"event_status": PENDING, REBUILD_MADE: None, **unscheduled},
        {"event_status": PROCESSING, REBUILD_MADE: None,
         "lease_until": {"$lt": bson_time(moment - lease)}, **unscheduled},
    ]}
    if exclude:
        found["idempotency_key"] = {"$nin": sorted(exclude)}
    return found


def _stale(lease: timedelta, shift: Shift | None) -> dict[str, Any]:
    # A lease that ran out a lease ago or more: no live worker can still finish it.
    return {"$lt": [{"$ifNull": ["$lease_until", EPOCH]}, store_now(shift, -lease)]}


def stale(record: Mapping[str, Any], now: datetime, lease: timedelta) -> bool:
    """True when ``record``'s lease ran out a lease ago or more at ``now`` (``_stale``)."""
    until = record.get("lease_until")
    return not isinstance(until, datetime) or bson_time(until) < bson_time(now) - lease


def redrivable(record: Mapping[str, Any], now: datetime, lease: timedelta) -> bool:
    """Return True when ``record`` matches ``redrive_filter`` at the store's ``now``."""
    due = record.get("redrive_at")
    come = not isinstance(due, datetime) or bson_time(due) <= bson_time(now)
    status = record.get("event_status")
    if status == FAILED:
        return record.get("retryable") is True and isinstance(due, datetime) and come
    if record.get(REBUILD_MADE) is not None:  # only its rebuild runs it
        return False
    if status == PENDING:
        return come
    return status == PROCESSING and stale(record, now, lease) and come


def redriven_filter(key: str, redrives: int) -> dict[str, Any]:
    """Match ``key`` only while no other sweeper redrove it since (``redriven_update`` checks,
    on the server's clock, that no live worker holds it)."""
    count: Any = redrives if redrives else {"$in": [0, None]}
    return {"idempotency_key": key, "event_status": {"$in": [FAILED, PENDING, PROCESSING]},
            "redrives": count}


PARKS = "parks"
"""How many times a record was parked (its partner paused): no claim erases it."""


def redriven_update(next_at: datetime, lease: timedelta,
                    shift: Shift | None = None) -> list[dict[str, Any]]:
    """Return the update that counts a redrive and schedules the next one, unless a live
    worker holds the record (PROCESSING under a lease that is not stale)."""
    return guarded({"$set": {"redrive_at": bson_time(next_at)}, "$inc": {"redrives": 1}},
                   {"$or": [{"$ne": ["$event_status", PROCESSING]}, _stale(lease, shift)]})


def abandon_filter(key: str) -> dict[str, Any]:
    """Return the filter of ``abandon``: the key, while FAILED-retryable, PENDING or PROCESSING.

    Whether a PROCESSING one is stale (its lease ran out a lease ago or more,
    so no live worker can still finish it) is decided in the write, on the
    server's clock (``abandon_update``).
    """
    return {"idempotency_key": key, "$or": [
        {"event_status": FAILED, "retryable": True},
        {"event_status": {"$in": [PENDING, PROCESSING]}}]}


def abandonable(record: Mapping[str, Any], now: datetime, lease: timedelta) -> bool:
    """Return True when ``record`` matches ``abandon_filter`` at the store's ``now``."""
    status = record.get("event_status")
    if status == FAILED:
        return record.get("retryable") is True
    return status == PENDING or (status == PROCESSING and stale(record, now, lease))

ABANDON_UNSET = ("redrive_at", "lease_until", "lease_owner")
"""Fields a record given up for good no longer has: nothing schedules or holds it."""


def abandon_fields(now: datetime, error: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a record given up for good gets (``ABANDON_UNSET`` go)."""
    return {"event_status": FAILED, "retryable": False, "error": dict(error),
            "lastUpdatedTime": epoch_ms(now)}


def abandon_update(now: datetime, error: Mapping[str, Any], lease: timedelta,
                   shift: Shift | None = None) -> list[dict[str, Any]]:
    """Return the update that gives a record up for good after its last redrive, unless a
    live worker holds it (decided on the server's clock)."""
    return guarded({"$set": abandon_fields(now, error),
                    "$unset": dict.fromkeys(ABANDON_UNSET, "")},
                   {"$or": [{"$ne": ["$event_status", PROCESSING]}, _stale(lease, shift)]})


def reject_update(fields: Mapping[str, Any], now: datetime, error: Mapping[str, Any], *,
                  created_by: str, retention: timedelta,
                  raw_payload: str | None = None) -> dict[str, Any]:
    """Return the upsert that stores a rejected event as FAILED for good.

    Only ``$setOnInsert``: an existing record, whatever its state, is never
    changed. No claim was taken, so ``attempts`` is 0 and the attempt map is empty.
    """
    record = insert_fields(fields, now, created_by=created_by, retention=retention)
    record["entity_metadata"] = {**fields.get("entity_metadata", {}),
                                 "resilienceAttemptCount": {}}
    record.update(event_status=FAILED, retryable=False, error=dict(error), attempts=0,
                  lastUpdatedTime=epoch_ms(now), **{REJECTED: True})
    if raw_payload is not None:
        record["raw_payload"] = raw_payload
    return {"$setOnInsert": record}


def reject_upsert(key: str, fields: Mapping[str, Any], now: datetime,
                  error: Mapping[str, Any], *, created_by: str, retention: timedelta,
                  raw_payload: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the filter and upsert of ``EventStore.reject``: a new record, or one delivery more.

    A key with no record gets ``reject_update``'s record and ``delivery_count``
    1. The record of ``key`` when it is this very refusal again (``repeats``:
    stored by rejection, never claimed since, the same ``payload_sha256``)
    counts one more delivery, and nothing else of it changes. Any other
    record of ``key`` matches neither: the upsert's insert then fails on the
    unique key, and the record stays as it is. ``fields`` without a
    ``payload_sha256`` only ever insert.
    """
    update = reject_update(fields, now, error, created_by=created_by, retention=retention,
                           raw_payload=raw_payload)
    sha = fields.get("payload_sha256")
    if not isinstance(sha, str) or not sha:
        update["$setOnInsert"][DELIVERY_COUNT] = 1
        return key_filter(key), update
    # Inserted, the equality fields are the record's own (``reject_update`` sets them the same).
    selector = {**key_filter(key), REJECTED: True, "event_status": FAILED, "payload_sha256": sha}
    return selector, {**update, "$inc": {DELIVERY_COUNT: 1}}


def repeats(record: Mapping[str, Any] | None, fields: Mapping[str, Any]) -> bool:
    """Return True when ``reject`` of ``fields`` counts one more delivery on ``record``.

    Mirrors ``reject_upsert``'s filter; change both together.
    """
    sha = fields.get("payload_sha256")
    return isinstance(sha, str) and bool(sha) and is_rejected(record) and \
        (record or {}).get("payload_sha256") == sha
