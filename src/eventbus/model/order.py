"""Per-entity order: an event's position, and the entity whose applied position it is compared to.

A handler declared with ``ordered_by="entity_data.orderStatusLatestTimestamp"``
reads, for each event, the value at that dotted path of the event document
as the handler reads it (after its upcasters):

* an integer (not a bool) within a signed 64-bit range, or a finite float;
* or an RFC 3339 time (``2026-11-25T12:00:00.123Z``, an offset, or none for
  UTC), turned into epoch microseconds.

Each position has a **kind**: ``number`` or ``time``. A route's positions
must all be of one kind (and, for numbers, of one unit: numbers are compared
as given, so seconds and milliseconds cannot be told apart). The entity
stores the kind of its applied position beside it; an event whose kind is
not the entity's cannot be ordered against it (2020 as epoch microseconds is
"newer" than 2025 as epoch seconds) and is stored FAILED for good with
``mismatch``'s reason, never run and never stale (issue 39, fault 8). An
entity stored before kinds were (no kind beside its position) takes the kind
of the next event applied to it. A missing value, or anything else, is an
``OrderError``: the event can never run, and is stored FAILED for good with
the reason.

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
NUMBER = "number"
"""The kind of a position given as a number (compared as given: one unit per route)."""
TIME = "time"
"""The kind of a position given as an RFC 3339 time (compared as epoch microseconds)."""
UNTAGGED = ""
"""The kind of an applied position stored before kinds were: comparable with either."""
_NAMED = {NUMBER: "a number", TIME: "an RFC 3339 time"}
_INT64 = 2**63 - 1
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?",
                      re.ASCII)
ENTITY_PREFIX = "entity:"
"""Entity records live under keys no publisher can send (publisher keys are ``p:``-scoped)."""


class OrderError(InvalidEvent):
    """The event's ``ordered_by`` value is missing or not a number or an RFC 3339 time."""


class PositionKindMismatch(OrderError):
    """The event's position is of another kind than its entity's applied position."""


@dataclasses.dataclass(frozen=True)
class Ordering:
    """Where an ordered event stands: its entity and its position."""

    entity_key: str
    partner_id: str
    entity_type: str
    entity_id: str
    position: Position
    kind: str = NUMBER
    """``NUMBER`` or ``TIME``: what the publisher sent (a time's position is its microseconds)."""

    def fields(self) -> dict[str, Any]:
        """The entity record's identifying fields, as stored (seed names)."""
        return {"partnerId": self.partner_id, "entity_type": self.entity_type,
                "entity_id": self.entity_id}


def ordering(event: Event, path: str) -> Ordering:
    """Return ``event``'s entity and position under ``path``, or raise ``OrderError``."""
    meta = event.entity_metadata
    value = lookup(event.to_document(), path)
    return Ordering(entity_key(meta.partner_id, meta.entity_type, meta.entity_id),
                    meta.partner_id, meta.entity_type, meta.entity_id,
                    position(value, path), kind_of(value))


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


def kind_of(value: Any) -> str:
    """The kind of a value ``position`` accepted: ``TIME`` for text, else ``NUMBER``."""
    return TIME if isinstance(value, str) else NUMBER


def comparable(kind: str, applied: str) -> bool:
    """True when a position of ``kind`` can be ordered against an applied one of ``applied``.

    An untagged applied position (stored before kinds were) is comparable with
    either kind, as it was then: refusing would freeze every such entity.
    """
    return applied == UNTAGGED or kind in (UNTAGGED, applied)


def mismatch(order: Ordering, applied: Position | None, applied_kind: str) -> str | None:
    """Why ``order`` cannot be compared with its entity's applied position, or None if it can."""
    if applied is None or comparable(order.kind, applied_kind):
        return None
    return (f"position {_as_text(order.position, order.kind)} is {_named(order.kind)}, but its "
            f"entity's applied position {_as_text(applied, applied_kind)} is "
            f"{_named(applied_kind)}: one route's "
            f"positions must all be {_named(applied_kind)} (in one unit), so the two "
            f"cannot be ordered")


def _as_text(position: Position, kind: str) -> str:
    # A time's position is its epoch microseconds: shown as the time it is.
    if kind == TIME and isinstance(position, int):
        try:
            moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=position)
            return moment.isoformat().replace("+00:00", "Z")
        except OverflowError:
            pass
    return _shown(position)


def _named(kind: str) -> str:
    return _NAMED.get(kind, repr(kind))


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
