"""A record's fields: the seed schema's statuses, times and audit fields, as first stored.

Times follow seed 002: ``created`` and ``lastUpdatedTime`` are epoch-millisecond
*strings*, ``expire_at`` and ``lease_until`` are BSON dates.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from eventbus.clock import bson_time
from eventbus.model import content, keys
from eventbus.model.delivery import Delivery
from eventbus.model.errors import InvalidEvent
from eventbus.model.event import DIRECTIONS, Event, json_object
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
MAX_ERROR_TYPE = 200


# Salvaged strings from a payload that failed validation are capped like
# validated ids are, so a hostile payload cannot bloat the indexed fields.
_SALVAGE_MAX = 256
_MILLISECOND = timedelta(milliseconds=1)
REJECTED = "rejected"
"""Set on a record stored by rejection (``reject_update``): FAILED for good, never claimed."""
REBUILD_MADE = "rebuild_made"
"""The id of the rebuild that made a record (an archived event with no record here, run by
``eventbus rebuild --from-archive``). While such a record is unfinished (PENDING or
PROCESSING) only a rebuild runs it: the redrive leaves it out (``redrive_filter``) and
``--resume`` (or a rebuild given its key) claims it again once its lease lapsed."""
NOT_BEFORE = "not_before"
"""On a FAILED-retryable record a handler or partner deferred (``RetryAfter``): no claim
takes it before this time on the store's clock, a duplicate delivery included (it is
answered as a duplicate and acked); the store's redrive brings it back then (its
``redrive_at`` is the same time). A replay, and the claim that takes it, remove it."""

DELIVERY_COUNT = "delivery_count"
"""On a record stored by rejection: how many times these very bytes came (``payload_sha256``).

1 when stored; each later ``reject`` of the same key with the same bytes adds
one (a redelivery, or the same bytes published again: ``keys.rejected_key``
keys a refused payload by its bytes, not its message id). Nothing else of
the record changes. A record stored before counting began has none until
its next delivery, which makes it 1."""

REJECTION_FIELDS = ("error", "event_type", "event_version", "entity_data", "payload_fingerprint",
                    "payload_sha256", "payload_size", "raw_payload", DELIVERY_COUNT,
                    "lastUpdatedTime")
"""What ``rejections`` keeps of a refused attempt when a corrected payload takes its record."""

AUDIT_FIELDS = ("created", "createdBy", "expire_at", "event_day_id")
"""Written once, when a record is new: a corrected payload taking a rejected record keeps them."""


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
                 parent_key: str = "", root_key: str = "",
                 made: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Return the seed fields stored when the event's record is inserted.

    ``fingerprint`` identifies the payload (``eventbus.model.keys.fingerprint``,
    computed when not given): a different payload under the same key is a
    conflict, never a duplicate. ``made``: ``event.to_document()`` and
    ``delivery.pubsub_document()`` when the caller made them already (intake,
    for the fingerprint); the first becomes the fields, so it is the caller's no more.
    """
    fields, pubsub = made or (event.to_document(), delivery.pubsub_document())
    fields.update(pubsub=pubsub, payload_fingerprint=fingerprint or keys.fingerprint(event))
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
    # Whose code raised is unknown (a handler's, an upcaster's): its name and
    # message are made storable here, once for every store and every path.
    return {"type": content.bounded_text(type(exc).__name__, MAX_ERROR_TYPE),
            "message": content.error_text(exc, MAX_ERROR_MESSAGE),
            "classification": classification}


def insert_fields(fields: Mapping[str, Any], now: datetime, *, created_by: str,
                  retention: timedelta) -> dict[str, Any]:
    """Return every field a new record gets once: the seed fields plus the audit fields.

    The audit fields are written last so ``fields`` can never override them.
    """
    now = bson_time(now)  # once: each helper below would truncate it again
    since = now - EPOCH
    return {**fields, "created": str(since // _MILLISECOND), "createdBy": created_by,
            "expire_at": bson_time(now + retention), "event_day_id": since.days}


def seed_metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``entity_metadata`` a new record starts from: the event's, no attempt map."""
    return {name: value for name, value in (fields.get("entity_metadata") or {}).items()
            if name != "resilienceAttemptCount"}


def new_record(key: str, fields: Mapping[str, Any], now: datetime, *, owner: str,
               lease: timedelta, created_by: str, retention: timedelta,
               lease_from: datetime | None = None) -> dict[str, Any]:
    """Return the document a claim makes of a key that has none: attempt 1, leased to ``owner``.

    What ``claim_pipeline`` writes for a new key, as a plain document, so a
    batch can insert its new keys (a cheaper write than a pipeline upsert) and
    claim only the keys that exist. Mirrors the pipeline; the batch contract
    tests compare the two. ``now`` stamps the audit fields, as the caller's
    ``now`` does for a claim; the lease runs from ``lease_from`` (the store's
    clock), ``now`` when not given.
    """
    now = bson_time(now)
    stamp = epoch_ms(now)
    start = bson_time(lease_from) if lease_from is not None else now
    return {"idempotency_key": key,
            **insert_fields(fields, now, created_by=created_by, retention=retention),
            "event_status": PROCESSING, "lease_until": bson_time(start + lease),
            "lease_owner": owner, "attempts": 1, "lastUpdatedTime": stamp,
            "pubsub": fields.get("pubsub", {}),
            "entity_metadata": {**seed_metadata(fields), "resilienceAttemptCount": {"1": stamp}}}
