"""Per-entity order: an event's position, and the entity whose applied position it is compared to.

A handler declared with ``ordered_by="entity_data.orderStatusLatestTimestamp"``
reads, for each event, the value at that dotted path of the event document
as the handler reads it (after its upcasters):

* an integer (not a bool) within a signed 64-bit range, or a finite float;
* or an RFC 3339 time (``2026-11-25T12:00:00.123Z``, an offset, or none for
  UTC), turned into epoch microseconds.

Numbers and times are not mixed by one handler in practice; if they are,
they compare as numbers (a time is its epoch microseconds). A missing value,
or anything else, is an ``OrderError``: the event can never run, and is
stored FAILED for good with the reason.

The entity is the event's partner, ``entity_type`` and ``entity_id``; its
record in the store is ``entity_key(...)``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import re
from typing import Any

from eventbus.model.errors import InvalidEvent
from eventbus.model.event import Event, lookup

Position = int | float
_INT64 = 2**63 - 1
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?",
                      re.ASCII)
ENTITY_PREFIX = "entity:"
"""Entity records live under keys no publisher can send (publisher keys are ``p:``-scoped)."""


class OrderError(InvalidEvent):
    """The event's ``ordered_by`` value is missing or not a number or an RFC 3339 time."""


@dataclasses.dataclass(frozen=True)
class Ordering:
    """Where an ordered event stands: its entity and its position."""

    entity_key: str
    partner_id: str
    entity_type: str
    entity_id: str
    position: Position

    def fields(self) -> dict[str, Any]:
        """The entity record's identifying fields, as stored (seed names)."""
        return {"partnerId": self.partner_id, "entity_type": self.entity_type,
                "entity_id": self.entity_id}


def ordering(event: Event, path: str) -> Ordering:
    """Return ``event``'s entity and position under ``path``, or raise ``OrderError``."""
    meta = event.entity_metadata
    return Ordering(entity_key(meta.partner_id, meta.entity_type, meta.entity_id),
                    meta.partner_id, meta.entity_type, meta.entity_id,
                    position(lookup(event.to_document(), path), path))


def entity_key(partner_id: str, entity_type: str, entity_id: str) -> str:
    """The store key of an entity's record: a hash, so any ids make a short, safe key."""
    text = json.dumps([partner_id, entity_type, entity_id], ensure_ascii=True)
    return ENTITY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:40]


def position(value: Any, path: str = "ordered_by") -> Position:
    """Return ``value`` as a comparable position, or raise ``OrderError`` saying why.

    The position is a plain ``int`` or ``float`` even when an upcaster put a
    subclass there: the stages after the read (sorting a lane, comparing with
    the applied position, storing it) never run code of the event's.
    """
    if isinstance(value, bool) or value is None:
        raise OrderError(f"{path}: no number or RFC 3339 time (got {_shown(value)})")
    if isinstance(value, int):
        value = int.__int__(value)  # the base method: a subclass's own is never called
        if abs(value) > _INT64:
            raise OrderError(f"{path}: {_shown(value)} is outside the 64-bit range")
        return value
    if isinstance(value, float):
        value = float.__float__(value)
        if not math.isfinite(value):
            raise OrderError(f"{path}: {_shown(value)} is not a finite number")
        return value
    if isinstance(value, str):
        return _time(str.__str__(value), path)
    raise OrderError(f"{path}: no number or RFC 3339 time (got {type(value).__name__})")


def _time(text: str, path: str) -> int:
    if len(text) > 64 or not _RFC3339.fullmatch(text):
        raise OrderError(f"{path}: {_shown(text)} is not an RFC 3339 time")
    try:
        moment = dt.datetime.fromisoformat(_seven_digits(text.replace("z", "Z")))
    except ValueError:
        raise OrderError(f"{path}: {_shown(text)} is not a valid time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _seven_digits(text: str) -> str:
    # Python reads at most 6 fraction digits; RFC 3339 allows more (nanoseconds).
    return re.sub(r"\.(\d{6})\d+", r".\1", text)


def _shown(value: Any) -> str:
    return repr(value)[:60]
