"""The writes that move a claimed record on: renew, succeed, fail, reject, redrive, abandon."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.store.documents.records import (
    FAILED,
    PENDING,
    PROCESSING,
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
    """Return the filter that matches ``key`` only while ``owner`` still holds its lease."""
    return {"idempotency_key": key, "lease_owner": owner, "event_status": PROCESSING}


def renew_update(now: datetime, lease: timedelta) -> dict[str, Any]:
    """Return the update that extends a held lease from ``now`` (``owner_filter`` guards it)."""
    return {"$set": {"lease_until": bson_time(bson_time(now) + lease)}}


def succeed_update(now: datetime, outbox: Sequence[Mapping[str, Any]] = (),
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the update that marks a claimed record SUCCESS, with its children if any."""
    done: dict[str, Any] = {**(extra or {}), "event_status": SUCCESS,
                            "lastUpdatedTime": epoch_ms(now)}
    if outbox:
        done["outbox"] = [dict(child) for child in outbox]
    return {"$set": done, "$unset": {"lease_until": "", "lease_owner": ""}}


def unclaim_update(now: datetime) -> dict[str, Any]:
    """Return the update that gives a claim back: PENDING again, its attempt returned.

    For an ordered event whose entity another worker holds: nothing ran, so
    nothing is spent; the next claim takes the same attempt number again.
    """
    return {"$set": {"event_status": PENDING, "lastUpdatedTime": epoch_ms(now)},
            "$unset": {"lease_until": "", "lease_owner": ""}, "$inc": {"attempts": -1}}


def finish_update(finish: Any, now: datetime) -> dict[str, Any]:
    """Return the update that stores one ``store.base.Finish`` (SUCCESS, FAILED, or unclaimed)."""
    if finish.unclaim:
        return unclaim_update(now)
    if finish.error is None:
        return succeed_update(now, finish.outbox, finish.extra)
    return fail_update(now, finish.error, retryable=finish.retryable,
                       redrive_at=finish.redrive_at)


def fail_fields(now: datetime, error: Mapping[str, Any], *, retryable: bool,
                redrive_at: datetime | None = None) -> dict[str, Any]:
    """Return the fields a FAILED record gets; ``redrive_at`` when the store finishes its retry."""
    fields = {"event_status": FAILED, "retryable": retryable, "error": dict(error),
              "lastUpdatedTime": epoch_ms(now)}
    if retryable and redrive_at is not None:
        fields["redrive_at"] = bson_time(redrive_at)
    return fields


def fail_update(now: datetime, error: Mapping[str, Any], *, retryable: bool,
                redrive_at: datetime | None = None) -> dict[str, Any]:
    """Return the update that marks a claimed record FAILED, retryable or for good."""
    return {"$set": fail_fields(now, error, retryable=retryable, redrive_at=redrive_at),
            "$unset": {"lease_until": "", "lease_owner": ""}}


def redrive_filter(now: datetime, stale_before: datetime,
                   exclude: Collection[str] = ()) -> dict[str, Any]:
    """Return the filter of records the store must have delivered again.

    FAILED-retryable records whose ``redrive_at`` has come, and PROCESSING
    records whose lease expired before ``stale_before`` (their worker died
    and nothing redelivered them) unless a redrive is already scheduled.
    Keys in ``exclude`` (already seen by this pass) are left out.
    """
    moment = bson_time(now)
    found: dict[str, Any] = {"$or": [
        {"event_status": FAILED, "retryable": True, "redrive_at": {"$lte": moment}},
        {"event_status": PROCESSING, "lease_until": {"$lt": bson_time(stale_before)},
         "$or": [{"redrive_at": {"$exists": False}}, {"redrive_at": {"$lte": moment}}]},
    ]}
    if exclude:
        found["idempotency_key"] = {"$nin": sorted(exclude)}
    return found


def redrivable(record: Mapping[str, Any], now: datetime, stale_before: datetime) -> bool:
    """Return True when ``record`` matches ``redrive_filter`` (the memory store's rule)."""
    due = record.get("redrive_at")
    if record.get("event_status") == FAILED:
        return record.get("retryable") is True and isinstance(due, datetime) and \
            bson_time(due) <= bson_time(now)
    if record.get("event_status") != PROCESSING:
        return False
    lease = record.get("lease_until")
    stale = not isinstance(lease, datetime) or bson_time(lease) < bson_time(stale_before)
    return stale and (not isinstance(due, datetime) or bson_time(due) <= bson_time(now))


def redriven_filter(key: str, redrives: int) -> dict[str, Any]:
    """Return the filter that matches ``key`` only while no other sweeper redrove it since."""
    count: Any = redrives if redrives else {"$in": [0, None]}
    return {"idempotency_key": key, "event_status": {"$in": [FAILED, PROCESSING]},
            "redrives": count}


def redriven_update(next_at: datetime) -> dict[str, Any]:
    """Return the update that counts a redrive and schedules the next one."""
    return {"$set": {"redrive_at": bson_time(next_at)}, "$inc": {"redrives": 1}}


def abandon_filter(key: str, stale_before: datetime) -> dict[str, Any]:
    """Return the filter that matches ``key`` while FAILED-retryable or stale PROCESSING.

    Stale: its lease expired before ``stale_before`` (the worker died long ago),
    so no live worker can still finish it.
    """
    return {"idempotency_key": key, "$or": [
        {"event_status": FAILED, "retryable": True},
        {"event_status": PROCESSING, "lease_until": {"$lt": bson_time(stale_before)}}]}


def abandonable(record: Mapping[str, Any], stale_before: datetime) -> bool:
    """Return True when ``record`` matches ``abandon_filter`` (the memory store's rule)."""
    if record.get("event_status") == FAILED:
        return record.get("retryable") is True
    lease = record.get("lease_until")
    return record.get("event_status") == PROCESSING and isinstance(lease, datetime) and \
        bson_time(lease) < bson_time(stale_before)

ABANDON_UNSET = ("redrive_at", "lease_until", "lease_owner")
"""Fields a record given up for good no longer has: nothing schedules or holds it."""


def abandon_update(now: datetime, error: Mapping[str, Any]) -> dict[str, Any]:
    """Return the update that gives a record up for good after its last redrive."""
    return {"$set": {"event_status": FAILED, "retryable": False, "error": dict(error),
                     "lastUpdatedTime": epoch_ms(now)},
            "$unset": dict.fromkeys(ABANDON_UNSET, "")}


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
