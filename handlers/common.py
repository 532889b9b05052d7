"""Effects shared by the domain handlers: projections and payload checks.

A projection's ``_id`` is ``projection_id(partner, entity_id)``: the two parts
joined by ``:``, each with ``%`` and ``:`` percent-encoded first, so no two
(partner, id) pairs share an id (``acme:o`` + ``1`` is ``acme%3Ao:1``, while
``acme`` + ``o:1`` is ``acme:o%3A1``) and ordinary ids read as before
(``p1:59734``). An id is compared as text: order ``1`` and order ``"1"`` are
the same order.

Timestamps that order a projection (``event_time``) must be epoch seconds
that can be real: finite, not negative, below 1e12 (larger values are
milliseconds sent as seconds) and at most ``MAX_FUTURE_SECONDS`` ahead of
the handler's clock. Anything else is a ``PermanentError``: a value like
``1e308`` stored as ``asOf`` would make every later real status look older,
so it would be acked as processed and never applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bson.errors import BSONError
from pymongo.errors import DuplicateKeyError

from eventbus import Context, PermanentError

MAX_FUTURE_SECONDS = 24 * 3600
"""How far ahead of ``context.now()`` an event's timestamp may be (clock skew, time zones)."""
MILLISECONDS_THRESHOLD = 1e12
"""Epoch seconds this large are in the year 33658: the value is surely in milliseconds."""
MAX_ID_CHARS = 256
MAX_HISTORY = 100
"""A projection keeps the last this many changes in ``history`` (older ones drop off)."""
INT64 = (-(2**63), 2**63 - 1)
CONTENT_ERRORS = (BSONError, OverflowError, UnicodeEncodeError)
"""What the driver raises for a document it cannot encode: a retry never fixes it."""


def apply_projection(context: Context, collection: str, doc_id: str, as_of: float,
                     state: Mapping[str, Any]) -> bool:
    """Set ``state`` on a projection unless a newer event already did.

    Return True when this event's state is applied, now or by an earlier
    attempt of the same event: a retried handler must take the same
    decisions (emit the same children) as the attempt that applied it.

    Events may arrive out of order, so each projection keeps the timestamp of
    the state it shows and refuses older ones. The history records which
    event changed it (the last ``MAX_HISTORY`` changes), which makes a double
    application visible. A state the
    store cannot encode (a value it cannot hold) is a ``PermanentError``.
    """
    newer = {"_id": doc_id, "$or": [{"asOf": {"$lt": as_of}}, {"asOf": {"$exists": False}}]}
    try:
        context.db[collection].update_one(newer, _change(context, as_of, state), upsert=True)
    except DuplicateKeyError:
        if context.db[collection].count_documents({"_id": doc_id, "history.key": context.key}):
            return True
        context.log.info("stale event for %s %s ignored", collection, doc_id)
        return False
    except CONTENT_ERRORS as exc:
        raise PermanentError(f"{collection} state cannot be stored: "
                             f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    return True


def store_projection(context: Context, collection: str, doc_id: str, as_of: float,
                     state: Mapping[str, Any]) -> None:
    """Set ``state`` on a projection whose handler is ordered (``ordered_by``).

    The framework runs such a handler only for the entity's newest event, so
    no timestamp is compared here. A retried attempt of the event that already
    applied its state changes nothing (``updatedBy`` is its key); the history
    keeps the last ``MAX_HISTORY`` changes. A state the store cannot encode is
    a ``PermanentError``.
    """
    mine = {"_id": doc_id, "updatedBy": {"$ne": context.key}}
    try:
        context.db[collection].update_one(mine, _change(context, as_of, state), upsert=True)
    except DuplicateKeyError:
        return  # this event applied it already: an earlier attempt got this far
    except CONTENT_ERRORS as exc:
        raise PermanentError(f"{collection} state cannot be stored: "
                             f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def _change(context: Context, as_of: float, state: Mapping[str, Any]) -> dict[str, Any]:
    # Bounded: a long-lived entity must never grow past the store's document
    # limit (a write that could then never succeed).
    return {"$set": {**state, "asOf": as_of, "updatedBy": context.key},
            "$push": {"history": {"$each": [{"key": context.key, "asOf": as_of, **state}],
                                  "$slice": -MAX_HISTORY}},
            "$inc": {"eventsApplied": 1}}


def projection_id(partner_id: str, entity_id: int | str) -> str:
    """Return the ``_id`` of an entity's projection (rule in the module docstring)."""
    return f"{_escaped(partner_id)}:{_escaped(str(entity_id))}"


def _escaped(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A")


def require(data: Mapping[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``data[field]`` if it has type ``kind``; a payload without it can never succeed."""
    value = data.get(field)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise PermanentError(f"entity_data.{field} is missing or not {_name(kind)}")
    return value


def require_id(data: Mapping[str, Any], field: str) -> int | str:
    """Return an entity id: a 64-bit integer, or text of 1 to ``MAX_ID_CHARS`` characters."""
    value = require(data, field, (int, str))
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise PermanentError(f"entity_data.{field} does not fit in 64 bits")
        return int(value)
    return require_text(value, f"entity_data.{field}")


def require_text(value: str, what: str) -> str:
    """Return ``value`` if it is non-blank, at most ``MAX_ID_CHARS`` and valid Unicode."""
    if not value.strip() or len(value) > MAX_ID_CHARS:
        raise PermanentError(f"{what} must be 1 to {MAX_ID_CHARS} characters, not blank")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PermanentError(f"{what} is not valid Unicode text (a lone surrogate)") from None
    return value


def event_time(context: Context, data: Mapping[str, Any], field: str) -> int | float:
    """Return ``data[field]`` as epoch seconds that can order a projection (module docstring)."""
    value = require(data, field, (int, float))
    what = f"entity_data.{field}"
    if isinstance(value, float) and not math.isfinite(value):
        raise PermanentError(f"{what} is not a finite number")
    if value < 0:
        raise PermanentError(f"{what} is negative")
    if value >= MILLISECONDS_THRESHOLD:
        raise PermanentError(f"{what} is {str(value)[:24]}: epoch seconds are expected, "
                             "not milliseconds")
    latest = context.now().timestamp() + MAX_FUTURE_SECONDS
    if value > latest:
        raise PermanentError(f"{what} is more than {MAX_FUTURE_SECONDS} s in the future")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
