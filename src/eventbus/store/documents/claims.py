"""The claim rule: when a delivery may take a record, and the one-round-trip claim pipeline.

The rule exists twice, once as an aggregation expression that the server
evaluates inside the claim's single round trip (``claim_pipeline``), and once
in Python (``claimable``) for the in-memory store. The store tests check that
the two agree on generated documents.

Time: the server decides whether a lease ran out, and when the new one ends,
on its own clock (``$$NOW``, ``eventbus.clock.store_now``); the caller's
``now`` only stamps the audit fields (``lastUpdatedTime``, the attempt map,
``created``). A claim returns the record as it left it, so whether it took
the record is read off the result (its ``lease_owner`` is the claim's owner).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Shift, store_now
from eventbus.store.documents.records import (
    AUDIT_FIELDS,
    DELIVERY_COUNT,
    EPOCH,
    FAILED,
    NOT_BEFORE,
    PENDING,
    PROCESSING,
    REJECTED,
    REJECTION_FIELDS,
    bson_time,
    epoch_ms,
    insert_fields,
    seed_metadata,
)

# Scratch fields that live only inside the claim pipeline; the last stage removes them.
_NEW = "__eventbus_new"
_TAKE = "__eventbus_take"
_REDO = "__eventbus_redo"
_IF_NEW, _IF_TAKE, _IF_REDO = f"${_NEW}", f"${_TAKE}", f"${_REDO}"
_DROPPED_ON_REDO = (REJECTED, "payload_sha256", "payload_size", "raw_payload", DELIVERY_COUNT)


def is_new(previous: Mapping[str, Any] | None) -> bool:
    """Return True when a claim on ``previous`` writes a new record's fields.

    A record with no ``event_status`` (missing, null or empty) holds no event
    yet: the claim gives it the seed and audit fields and a fresh attempt map,
    as for a record that does not exist. Mirrors ``claim_pipeline``'s first
    stage (``__eventbus_new``); change both together.
    """
    return previous is None or previous.get("event_status") in (None, "")


def is_rejected(previous: Mapping[str, Any] | None) -> bool:
    """Return True for a record stored by rejection and never claimed since (``REJECTED``)."""
    return previous is not None and previous.get(REJECTED) is True and \
        previous.get("event_status") == FAILED


def redoes(previous: Mapping[str, Any] | None, fingerprint: str) -> bool:
    """Return True when a claim of ``fingerprint`` takes the rejected record ``previous``.

    A publisher that corrects a refused event and publishes it again under the
    same key must not be answered "duplicate": a different payload takes the
    record (the refusal moves to ``rejections``); the same payload stays a
    duplicate. Mirrors ``_redo_expression``; change both together.
    """
    return bool(fingerprint) and is_rejected(previous) and \
        (previous or {}).get("payload_fingerprint") != fingerprint


def conflicts(previous: Mapping[str, Any] | None, fingerprint: str) -> bool:
    """Return True when ``previous`` holds a different payload than ``fingerprint``.

    Records stored without a fingerprint, rejected records (``redoes``), and
    claims without one, never conflict.
    Mirrors the first term of ``_take_expression``; change both together.
    """
    if previous is None or not fingerprint or is_new(previous) or is_rejected(previous):
        return False
    stored = previous.get("payload_fingerprint")
    return stored is not None and stored != fingerprint


def claimable(previous: Mapping[str, Any] | None, now: datetime,
              fingerprint: str = "") -> bool:
    """Return True when a record in state ``previous`` may be claimed at ``now``.

    A different payload (``conflicts``) is never taken. Mirrors
    ``claim_pipeline``'s ``_take_expression``; change both together.
    """
    if previous is None or redoes(previous, fingerprint):
        return True
    if conflicts(previous, fingerprint):
        return False
    status = previous.get("event_status")
    if status is None or status in ("", PENDING):
        return True
    if status == FAILED:
        return previous.get("retryable") is True and due(previous.get(NOT_BEFORE), now)
    if status == PROCESSING:
        return lease_expired(previous.get("lease_until"), now)
    return False


def lease_expired(lease_until: Any, now: datetime) -> bool:
    """Return True when a lease that ran until ``lease_until`` is over at ``now``."""
    # The server treats a missing lease as the epoch; a PROCESSING record
    # without a lease could otherwise never be taken again.
    if not isinstance(lease_until, datetime):
        return True
    return bson_time(lease_until) < bson_time(now)


def due(not_before: Any, now: datetime) -> bool:
    """Return True when a deferral until ``not_before`` (a datetime, or none) is over at ``now``."""
    # As the lease: a deferral ends when the store's clock passes it; a missing or
    # malformed one (no deferral) never keeps a record from its claim.
    return not isinstance(not_before, datetime) or bson_time(not_before) <= bson_time(now)


def next_attempt(previous: Mapping[str, Any] | None) -> int:
    """Return the number of the attempt a claim on ``previous`` takes (1-based)."""
    attempts = (previous or {}).get("attempts")
    taken = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0
    return taken + 1


def claim_pipeline(fields: Mapping[str, Any], now: datetime, *, owner: str, lease: timedelta,
                   created_by: str, retention: timedelta,
                   shift: Shift | None = None) -> list[dict[str, Any]]:
    """Return the update pipeline of the claim's ``find_one_and_update``.

    Stage one decides, on the document as it was, whether it is new and
    whether it is taken; stage two rewrites each field only when taken (a
    record not taken keeps every field as it was); stage three drops the
    scratch decisions.
    """
    # Built once per push: the conditions are written out here rather than through
    # one helper call per field (about a third of building it).
    new = {"$eq": [{"$ifNull": ["$event_status", ""]}, ""]}
    fingerprint = str(fields.get("payload_fingerprint") or "")
    redo = _redo_expression(fingerprint)
    decide = {"$set": {_NEW: new, _REDO: redo,
                       _TAKE: {"$or": [redo, _take_expression(fingerprint, shift)]}}}
    fresh = {"$or": [_IF_NEW, _IF_REDO]}
    on_insert = {name: {"$cond": [_IF_NEW if name in AUDIT_FIELDS else fresh,
                                  {"$literal": value}, "$" + name]}
                 for name, value in insert_fields(fields, now, created_by=created_by,
                                                  retention=retention).items()}
    taken = {name: {"$cond": [_IF_TAKE, value, "$" + name]}
             for name, value in _taken_fields(fields, epoch_ms(now), owner, lease,
                                              shift).items()}
    return [decide, {"$set": {**_redo_fields(), **on_insert, **taken}},
            {"$unset": [_NEW, _TAKE, _REDO]}]


def _redo_expression(fingerprint: str) -> Any:
    # ``redoes`` on the server: a rejected record, and a payload it does not hold.
    if not fingerprint:
        return False
    return {"$and": [{"$eq": [{"$ifNull": [f"${REJECTED}", False]}, True]},
                     {"$eq": [{"$ifNull": ["$event_status", ""]}, FAILED]},
                     {"$ne": [{"$ifNull": ["$payload_fingerprint", ""]}, fingerprint]}]}


def _redo_fields() -> dict[str, Any]:
    # A corrected payload takes a rejected record: the refusal is kept in
    # ``rejections`` and what described only the refused payload goes.
    refused = {name: {"$ifNull": ["$" + name, "$$REMOVE"]} for name in REJECTION_FIELDS}
    kept = {"$concatArrays": [{"$ifNull": ["$rejections", []]}, [refused]]}
    return {"rejections": {"$cond": [_IF_REDO, kept, "$rejections"]},
            **{name: {"$cond": [_IF_REDO, "$$REMOVE", "$" + name]} for name in _DROPPED_ON_REDO}}


def _take_expression(fingerprint: str, shift: Shift | None) -> dict[str, Any]:
    status = {"$ifNull": ["$event_status", ""]}
    state = {"$or": [
        {"$in": [status, ["", PENDING]]},
        {"$and": [{"$eq": [status, FAILED]}, {"$eq": ["$retryable", True]},
                  {"$lte": [{"$ifNull": [f"${NOT_BEFORE}", EPOCH]}, store_now(shift)]}]},
        {"$and": [{"$eq": [status, PROCESSING]},
                  {"$lt": [{"$ifNull": ["$lease_until", EPOCH]}, store_now(shift)]}]},
    ]}
    if not fingerprint:
        return state
    same = {"$or": [{"$eq": [status, ""]},
                    {"$eq": [{"$ifNull": ["$payload_fingerprint", fingerprint]}, fingerprint]}]}
    return {"$and": [same, state]}


def _taken_fields(fields: Mapping[str, Any], stamp: str, owner: str,
                  lease: timedelta, shift: Shift | None) -> dict[str, Any]:
    attempt = {"$add": [{"$ifNull": ["$attempts", 0]}, 1]}
    return {
        "event_status": PROCESSING,
        "lease_until": store_now(shift, lease),
        "lease_owner": owner,
        "attempts": attempt,
        "lastUpdatedTime": stamp,
        "pubsub": {"$literal": fields.get("pubsub", {})},
        "entity_metadata": _metadata_with_attempt(fields, attempt, stamp),
        # retryable and error describe a FAILED record only.
        "retryable": "$$REMOVE",
        "error": "$$REMOVE",
        "redrive_at": "$$REMOVE",
        NOT_BEFORE: "$$REMOVE",
    }


def _metadata_with_attempt(fields: Mapping[str, Any], attempt: Mapping[str, Any],
                           stamp: str) -> dict[str, Any]:
    seed = seed_metadata(fields)
    fresh = {"$or": [_IF_NEW, _IF_REDO]}
    base = {"$cond": [fresh, {"$literal": seed}, "$entity_metadata"]}
    earlier = {"$cond": [fresh, {},
                         {"$ifNull": ["$entity_metadata.resilienceAttemptCount", {}]}]}
    entry = {"$arrayToObject": [[{"k": {"$toString": attempt}, "v": stamp}]]}
    return {"$mergeObjects": [base, {"resilienceAttemptCount": {"$mergeObjects": [earlier,
                                                                                  entry]}}]}
