"""Pure functions that build ``partner_events`` documents, filters and updates.

Nothing here talks to MongoDB: ``eventbus.store.mongo`` sends what these functions
build, and the unit tests check them without a server. Times follow seed 002:
``created`` and ``lastUpdatedTime`` are epoch-millisecond *strings*,
``expire_at`` and ``lease_until`` are BSON dates.

The claim rule exists twice, once as an aggregation expression that the
server evaluates inside the claim's single round trip, and once in Python
(``claimable``) to read the before-image the server returns. The store tests
check that the two agree on generated documents.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from eventbus.model import content, keys
from eventbus.model.delivery import Delivery
from eventbus.model.errors import InvalidEvent
from eventbus.model.event import DIRECTIONS, Event, json_object
from eventbus.model.forward import is_forward
from eventbus.model.status import Status

PENDING, PROCESSING, SUCCESS, FAILED = (Status.PENDING.value, Status.PROCESSING.value,
                                        Status.SUCCESS.value, Status.FAILED.value)
PUBLISHED = Status.PUBLISHED.value
STATUSES = (PENDING, PROCESSING, SUCCESS, FAILED)

UNKNOWN_TYPE = "UNKNOWN"
MINIMAL_FIELDS = ("event_type", "payload_size", "payload_sha256", "conflicts_with")
"""What is kept of a message when even its bounded form is refused: surely storable."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_ERROR_MESSAGE = 2000
# Salvaged strings from a payload that failed validation are capped like
# validated ids are, so a hostile payload cannot bloat the indexed fields.
_SALVAGE_MAX = 256
_MILLISECOND = timedelta(milliseconds=1)
# Scratch fields that live only inside the claim pipeline; the last stage removes them.
_NEW = "__eventbus_new"
_TAKE = "__eventbus_take"
_REDO = "__eventbus_redo"
REJECTED = "rejected"
"""Set on a record stored by rejection (``reject_update``): FAILED for good, never claimed."""
REJECTION_FIELDS = ("error", "event_type", "event_version", "entity_data", "payload_fingerprint",
                    "payload_sha256", "payload_size", "raw_payload", "lastUpdatedTime")
"""What ``rejections`` keeps of a refused attempt when a corrected payload takes its record."""
AUDIT_FIELDS = ("created", "createdBy", "expire_at", "event_day_id")
"""Written once, when a record is new: a corrected payload taking a rejected record keeps them."""


def bson_time(moment: datetime) -> datetime:
    """Return ``moment`` as BSON stores it: UTC, aware, truncated to the millisecond.

    Comparing in Python at a finer grain than the server would let the two
    halves of the claim rule disagree. A naive datetime is taken as UTC, as
    pymongo does.
    """
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.replace(microsecond=aware.microsecond // 1000 * 1000)


def epoch_ms(moment: datetime) -> str:
    """Return ``moment`` as seed 002 stores times: epoch milliseconds as a string."""
    return str((bson_time(moment) - EPOCH) // _MILLISECOND)


def event_day_id(moment: datetime) -> int:
    """Return the seed's partition day: whole days since the epoch (UTC)."""
    return (bson_time(moment) - EPOCH).days


def expire_at(created: datetime, retention: timedelta) -> datetime:
    """Return when the TTL index removes a record created at ``created``."""
    return bson_time(bson_time(created) + retention)


def event_fields(event: Event, delivery: Delivery, *, fingerprint: str = "",
                 parent_key: str = "", root_key: str = "") -> dict[str, Any]:
    """Return the seed fields stored when the event's record is inserted.

    ``fingerprint`` identifies the payload (``eventbus.model.keys.fingerprint``,
    computed when not given): a different payload under the same key is a
    conflict, never a duplicate.
    """
    fields = event.to_document()
    fields.update(pubsub=delivery.pubsub_document(),
                  payload_fingerprint=fingerprint or keys.fingerprint(event))
    if parent_key:
        fields["parent_key"] = parent_key
    if root_key:
        fields["root_key"] = root_key
    return fields


def refused_fields(delivery: Delivery, event: Event | None) -> dict[str, Any]:
    """Return the bounded fields of a message that is stored FAILED for good, unprocessed.

    Whatever the message holds, these fields are storable: the metadata is
    salvaged as short, safely encoded text, the payload is kept as its size,
    its hash and a bounded copy, and ``entity_data`` only when it is small and
    storable as it is. A rejected event still shows up in its partner's history.
    """
    fields = _salvaged(delivery, event)
    fields.update(content.payload_summary(delivery.data), pubsub=_safe_pubsub(delivery))
    data = event.entity_data if event is not None else {}
    small = content.problem({"d": data}) is None and \
        len(delivery.data) <= content.MAX_REJECTED_DATA_BYTES
    fields["entity_data"] = data if small else {}
    return fields


def _safe_pubsub(delivery: Delivery) -> dict[str, Any]:
    document = delivery.pubsub_document()
    safe = {name: content.safe_text(value) if isinstance(value, str) else value
            for name, value in document.items() if name != "attributes"}
    safe["attributes"] = {content.safe_text(name): content.safe_text(value, 1024)
                          for name, value in list(delivery.attributes.items())[:100]}
    return safe


def _salvaged(delivery: Delivery, event: Event | None) -> dict[str, Any]:
    if event is not None:
        body: dict[str, Any] = event.to_document()
    else:
        try:
            body = json_object(delivery.data)
        except InvalidEvent:
            body = {}
    attrs = delivery.attributes
    meta = body.get("entity_metadata")
    meta = meta if isinstance(meta, dict) else {}
    direction = body.get("event_direction")
    return {
        "event_type": _first_text(attrs.get("event_type"), body.get("event_type")) or UNKNOWN_TYPE,
        "event_version": _first_text(attrs.get("event_version"), body.get("event_version")),
        "event_direction": direction if direction in DIRECTIONS else "IN",
        "entity_metadata": {name: _first_text(meta.get(name))
                            for name in ("partnerId", "partnerName", "entity_id", "entity_type")},
        "entity_data": {},
    }


def _first_text(*candidates: Any) -> str:
    for value in candidates:
        if isinstance(value, str) and value.strip():
            return content.safe_text(value, _SALVAGE_MAX)
    return ""


def error_document(exc: BaseException, classification: str) -> dict[str, Any]:
    """Return the ``error`` subdocument stored on FAILED: type, message, classification."""
    return {"type": type(exc).__name__, "message": str(exc)[:MAX_ERROR_MESSAGE],
            "classification": classification}


def insert_fields(fields: Mapping[str, Any], now: datetime, *, created_by: str,
                  retention: timedelta) -> dict[str, Any]:
    """Return every field a new record gets once: the seed fields plus the audit fields.

    The audit fields are written last so ``fields`` can never override them.
    """
    return {**fields, "created": epoch_ms(now), "createdBy": created_by,
            "expire_at": expire_at(now, retention), "event_day_id": event_day_id(now)}


def seed_metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``entity_metadata`` a new record starts from: the event's, no attempt map."""
    return {name: value for name, value in (fields.get("entity_metadata") or {}).items()
            if name != "resilienceAttemptCount"}


def new_record(key: str, fields: Mapping[str, Any], now: datetime, *, owner: str,
               lease: timedelta, created_by: str, retention: timedelta) -> dict[str, Any]:
    """Return the document a claim makes of a key that has none: attempt 1, leased to ``owner``.

    What ``claim_pipeline`` writes for a new key, as a plain document, so a
    batch can insert its new keys (a cheaper write than a pipeline upsert) and
    claim only the keys that exist. Mirrors the pipeline; the batch contract
    tests compare the two.
    """
    now = bson_time(now)
    stamp = epoch_ms(now)
    return {"idempotency_key": key,
            **insert_fields(fields, now, created_by=created_by, retention=retention),
            "event_status": PROCESSING, "lease_until": bson_time(now + lease),
            "lease_owner": owner, "attempts": 1, "lastUpdatedTime": stamp,
            "pubsub": fields.get("pubsub", {}),
            "entity_metadata": {**seed_metadata(fields), "resilienceAttemptCount": {"1": stamp}}}


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
        return previous.get("retryable") is True
    if status == PROCESSING:
        return _lease_expired(previous.get("lease_until"), now)
    return False


def _lease_expired(lease_until: Any, now: datetime) -> bool:
    # The server treats a missing lease as the epoch; a PROCESSING record
    # without a lease could otherwise never be taken again.
    if not isinstance(lease_until, datetime):
        return True
    return bson_time(lease_until) < bson_time(now)


def next_attempt(previous: Mapping[str, Any] | None) -> int:
    """Return the number of the attempt a claim on ``previous`` takes (1-based)."""
    attempts = (previous or {}).get("attempts")
    taken = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0
    return taken + 1


def claim_pipeline(fields: Mapping[str, Any], now: datetime, *, owner: str, lease: timedelta,
                   created_by: str, retention: timedelta) -> list[dict[str, Any]]:
    """Return the update pipeline of the claim's ``find_one_and_update``.

    Stage one decides, on the document as it was, whether it is new and
    whether it is taken; stage two rewrites each field only when taken (a
    record not taken keeps every field as it was); stage three drops the
    scratch decisions.
    """
    new = {"$eq": [{"$ifNull": ["$event_status", ""]}, ""]}
    fingerprint = str(fields.get("payload_fingerprint") or "")
    redo = _redo_expression(fingerprint)
    decide = {"$set": {_NEW: new, _REDO: redo,
                       _TAKE: {"$or": [redo, _take_expression(now, fingerprint)]}}}
    fresh = {"$or": [f"${_NEW}", f"${_REDO}"]}
    on_insert = {name: {"$cond": [f"${_NEW}" if name in AUDIT_FIELDS else fresh,
                                  {"$literal": value}, f"${name}"]}
                 for name, value in insert_fields(fields, now, created_by=created_by,
                                                  retention=retention).items()}
    taken = {name: _when(_TAKE, value, name)
             for name, value in _taken_fields(fields, now, owner, lease).items()}
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
    refused = {name: {"$ifNull": [f"${name}", "$$REMOVE"]} for name in REJECTION_FIELDS}
    kept = {"$concatArrays": [{"$ifNull": ["$rejections", []]}, [refused]]}
    dropped = {name: _when_not(_REDO, name) for name in
               (REJECTED, "payload_sha256", "payload_size", "raw_payload")}
    return {"rejections": _when(_REDO, kept, "rejections"), **dropped}


def _when_not(flag: str, name: str) -> dict[str, Any]:
    return {"$cond": [f"${flag}", "$$REMOVE", f"${name}"]}


def _take_expression(now: datetime, fingerprint: str) -> dict[str, Any]:
    status = {"$ifNull": ["$event_status", ""]}
    state = {"$or": [
        {"$in": [status, ["", PENDING]]},
        {"$and": [{"$eq": [status, FAILED]}, {"$eq": ["$retryable", True]}]},
        {"$and": [{"$eq": [status, PROCESSING]},
                  {"$lt": [{"$ifNull": ["$lease_until", EPOCH]}, bson_time(now)]}]},
    ]}
    if not fingerprint:
        return state
    same = {"$or": [{"$eq": [status, ""]},
                    {"$eq": [{"$ifNull": ["$payload_fingerprint", fingerprint]}, fingerprint]}]}
    return {"$and": [same, state]}


def _when(flag: str, value: Any, name: str) -> dict[str, Any]:
    return {"$cond": [f"${flag}", value, f"${name}"]}


def _taken_fields(fields: Mapping[str, Any], now: datetime, owner: str,
                  lease: timedelta) -> dict[str, Any]:
    attempt = {"$add": [{"$ifNull": ["$attempts", 0]}, 1]}
    return {
        "event_status": PROCESSING,
        "lease_until": bson_time(bson_time(now) + lease),
        "lease_owner": owner,
        "attempts": attempt,
        "lastUpdatedTime": epoch_ms(now),
        "pubsub": {"$literal": fields.get("pubsub", {})},
        "entity_metadata": _metadata_with_attempt(fields, attempt, epoch_ms(now)),
        # retryable and error describe a FAILED record only.
        "retryable": "$$REMOVE",
        "error": "$$REMOVE",
        "redrive_at": "$$REMOVE",
    }


def _metadata_with_attempt(fields: Mapping[str, Any], attempt: Mapping[str, Any],
                           stamp: str) -> dict[str, Any]:
    seed = seed_metadata(fields)
    fresh = {"$or": [f"${_NEW}", f"${_REDO}"]}
    base = {"$cond": [fresh, {"$literal": seed}, "$entity_metadata"]}
    earlier = {"$cond": [fresh, {},
                         {"$ifNull": ["$entity_metadata.resilienceAttemptCount", {}]}]}
    entry = {"$arrayToObject": [[{"k": {"$toString": attempt}, "v": stamp}]]}
    return {"$mergeObjects": [base, {"resilienceAttemptCount": {"$mergeObjects": [earlier,
                                                                                  entry]}}]}


CONTENT_ERROR_CODES = frozenset({
    15,     # Overflow: nesting depth exceeded
    52,     # DollarPrefixedFieldName
    10334,  # BSONObjectTooLarge
    17280,  # KeyTooLong
    17419,  # a resulting document would be too large
})
"""Server error codes that mean "this content cannot be stored", not "the store is down"."""
_CONTENT_ERROR_CLASSES = frozenset({"InvalidDocument", "InvalidStringData", "DocumentTooLarge"})
_ENCODING_ERRORS = (OverflowError, UnicodeEncodeError, RecursionError)


def refuses_content(exc: BaseException) -> bool:
    """Return True when ``exc`` is a store refusing content, which no retry can change.

    A document over the size limit, a value or a key the server or the driver
    cannot hold. Matched by the server's error code and the driver's error
    class names (this module imports no driver: the memory store and the
    MongoDB store share the rule); everything else, a connection or a
    timeout, is left to the classifier (transient).
    """
    if isinstance(exc, _ENCODING_ERRORS):
        return True
    if getattr(exc, "code", None) in CONTENT_ERROR_CODES:
        return True
    return any(cls.__name__ in _CONTENT_ERROR_CLASSES for cls in type(exc).__mro__)


def key_filter(key: str) -> dict[str, Any]:
    """Return the filter that finds the record of ``key``."""
    return {"idempotency_key": key}


def owner_filter(key: str, owner: str) -> dict[str, Any]:
    """Return the filter that matches ``key`` only while ``owner`` still holds its lease."""
    return {"idempotency_key": key, "lease_owner": owner, "event_status": PROCESSING}


def renew_update(now: datetime, lease: timedelta) -> dict[str, Any]:
    """Return the update that extends a held lease from ``now`` (``owner_filter`` guards it)."""
    return {"$set": {"lease_until": bson_time(bson_time(now) + lease)}}


def succeed_update(now: datetime, outbox: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Return the update that marks a claimed record SUCCESS, with its children if any."""
    done: dict[str, Any] = {"event_status": SUCCESS, "lastUpdatedTime": epoch_ms(now)}
    if outbox:
        done["outbox"] = [dict(child) for child in outbox]
    return {"$set": done, "$unset": {"lease_until": "", "lease_owner": ""}}


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


# -- store-driven redrive ---------------------------------------------------------------------

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


# -- the outbox -----------------------------------------------------------------------------

def pending_filter(cutoff: datetime) -> dict[str, Any]:
    """Return the filter of documents with an outbox entry PENDING since ``cutoff`` or before.

    The plain ``outbox.status`` term lets the server use its index; the
    ``$elemMatch`` makes both conditions hold for the same entry.
    """
    return {"outbox.status": PENDING,
            "outbox": {"$elemMatch": {"status": PENDING, "created_at": {"$lte": cutoff}}}}


def entry_pending(entry: Mapping[str, Any], cutoff: datetime) -> bool:
    """Return True when an outbox entry is PENDING since ``cutoff`` or before."""
    created = entry.get("created_at")
    return (entry.get("status") == PENDING and isinstance(created, datetime)
            and bson_time(created) <= bson_time(cutoff))


def entry_filter(parent_key: str, index: int, child_key: str) -> dict[str, Any]:
    """Return the filter that matches entry ``index`` only while it is still PENDING.

    The outbox is written once with SUCCESS and never reordered, so an index
    names one entry for good; the key check guards against a rewritten document.
    """
    return {"idempotency_key": parent_key, f"outbox.{index}.idempotency_key": child_key,
            f"outbox.{index}.status": PENDING}


def published_fields(now: datetime, message_id: str) -> dict[str, Any]:
    """Return the fields an outbox entry gets when it is published."""
    return {"status": PUBLISHED, "published_at": bson_time(now), "messageId": message_id}


def publish_failed_fields(now: datetime, error: Mapping[str, Any]) -> dict[str, Any]:
    """Return the fields an outbox entry gets when publishing it failed (it stays PENDING)."""
    return {"last_error": dict(error), "last_attempt_at": bson_time(now)}


def published_update(index: int, now: datetime, message_id: str, tries: int) -> dict[str, Any]:
    """Return the update that marks entry ``index`` PUBLISHED."""
    entry = f"outbox.{index}"
    return {"$set": {f"{entry}.{name}": value
                     for name, value in published_fields(now, message_id).items()},
            "$inc": {f"{entry}.publish_attempts": tries},
            "$unset": {f"{entry}.last_error": ""}}


def failed_update(index: int, now: datetime, error: Mapping[str, Any],
                  tries: int) -> dict[str, Any]:
    """Return the update that records failed tries on entry ``index``, which stays PENDING."""
    entry = f"outbox.{index}"
    return {"$set": {f"{entry}.{name}": value
                     for name, value in publish_failed_fields(now, error).items()},
            "$inc": {f"{entry}.publish_attempts": tries}}


# -- guarded side effects -------------------------------------------------------------------

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
    return _lease_expired(record.get("lease_until"), now)


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


# -- operator queries -----------------------------------------------------------------------

SUMMARY_FIELDS = ("idempotency_key", "event_type", "event_status", "retryable", "error",
                  "outbox", "root_key")
"""What ``summaries`` returns of each event (of ``outbox``, only the child keys)."""
SUMMARY_OUTBOX_FIELDS = ("idempotency_key", "kind")
"""What a summary's query reads of each outbox entry."""


def cascade_filter(roots: Sequence[str]) -> dict[str, Any]:
    """Return the filter of the events whose key or root key is one of ``roots``."""
    ordered = sorted(roots)
    return {"$or": [{"idempotency_key": {"$in": ordered}}, {"root_key": {"$in": ordered}}]}


def summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """Return the summary fields of ``record``; the outbox keeps only its child keys.

    Forwards to public topics are not children (no event is stored for them).
    """
    kept = {name: record[name] for name in SUMMARY_FIELDS if name in record}
    if "outbox" in kept:
        kept["outbox"] = [{"idempotency_key": child.get("idempotency_key")}
                          for child in kept["outbox"] if not is_forward(child)]
    return kept
