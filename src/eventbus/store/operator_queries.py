"""The operator primitives: what the ``eventbus`` commands and the web console ask of a store.

Seed 002's query patterns ("Failed Events for Retry", "Partner Event
History", the attempt timestamps) as a handful of primitives, so that the
operator tools, like the processor, never see a collection:

* ``find_events(query, limit=, fields=, order=)``: records matching an
  ``EventQuery``, newest first (``created`` descending) or most attempts first;
* ``count_events(query, group_by, bucket_ms=)``: counts by a few fields and,
  optionally, by a time bucket of ``created``;
* ``record_replay(key, entry, now, reopen=)``: one atomic update that appends
  an audit entry to ``replays`` and, with ``reopen``, makes a FAILED record
  claimable again (retryable, ``replayed_at_attempt = attempts``);
* ``store_dead_letter(key, fields, now, error, mark, raw_payload=)``: store a
  dead-lettered message as a FAILED record marked ``dead_lettered``, or mark
  the record its key already has.

``MongoEventStore`` gets them from ``MongoOperatorMixin`` (``mongo_ops``),
``MemoryEventStore`` from ``MemoryOperatorMixin`` (``memory_ops``); the
contract suite (``tests/contract/test_operator_store.py``) runs on both.
The pure helpers below are shared by the two, so they cannot disagree on
what a query matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

from eventbus.model.event import lookup
from eventbus.store import documents
from eventbus.store.base import Record

Order = Literal["newest", "attempts"]
"""``newest``: ``created`` descending (seed 002's history order); ``attempts``: most first."""
StoredAs = Literal["stored", "marked"]
"""What ``store_dead_letter`` did: a new FAILED record, or a mark on the existing one."""

HISTORY_KEY = "entity_metadata.resilienceAttemptCount"
PARTNER = "entity_metadata.partnerId"
ENTITY_TYPE = "entity_metadata.entity_type"
ENTITY_ID = "entity_metadata.entity_id"


@dataclasses.dataclass(frozen=True)
class EventQuery:
    """Which records an operator query matches; unset fields match everything.

    ``since``/``until`` bound ``created`` (seed 002 stores it as epoch-ms
    text of fixed width, so text order is time order). ``below_attempt`` is
    the seed's retry query: the attempt map has no entry ``below_attempt``.
    """

    statuses: tuple[str, ...] = ()
    event_type: str | None = None
    partner_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    retryable: bool | None = None
    below_attempt: int | None = None
    min_attempts: int | None = None
    dead_lettered: bool | None = None
    entity_type: str | None = None
    entity_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Count:
    """One group of ``count_events``: the values of the grouped fields, and how many."""

    values: tuple[Any, ...]
    count: int
    bucket: int | None = None
    """Start of the ``created`` time bucket, epoch ms; None without ``bucket_ms``."""


class OperatorStore(Protocol):
    """The operator primitives both stores implement (next to ``EventStore``'s)."""

    def find_events(self, query: EventQuery, *, limit: int,
                    fields: Sequence[str] | None = None,
                    order: Order = "newest") -> list[Record]:
        """Return at most ``limit`` matching records (top-level ``fields`` only, if given)."""
        ...

    def count_events(self, query: EventQuery, group_by: Sequence[str], *,
                     bucket_ms: int | None = None) -> list[Count]:
        """Count matching records by the (dotted) fields ``group_by`` and a ``created`` bucket."""
        ...

    def record_replay(self, key: str, entry: Mapping[str, Any], now: datetime, *,
                      reopen: bool, redrive_at: datetime | None = None) -> Record | None:
        """Append ``entry`` to ``replays`` (and reopen a FAILED record); the record after.

        None when ``key`` has no record; ``AlreadyExists(record)`` when
        ``reopen`` is asked of a record that is not FAILED (nothing changed).
        A reopened record is due for the store-driven redrive at
        ``redrive_at`` (on the store's clock) with a fresh redrive budget, so
        a replayed message that is never delivered is not lost.
        """
        ...

    def store_dead_letter(self, key: str, fields: Mapping[str, Any], now: datetime,
                          error: Mapping[str, Any], mark: Mapping[str, Any],
                          raw_payload: str | None = None) -> StoredAs:
        """Store a dead-lettered message FAILED for good, or mark the record of ``key``."""
        ...


# -- pure helpers shared by both implementations -----------------------------------------

def query_filter(query: EventQuery) -> dict[str, Any]:
    """Return the MongoDB filter of ``query`` (``memory_ops`` applies ``matches`` instead)."""
    terms: dict[str, Any] = dict(documents.NOT_ENTITY)  # events only, never entity records
    if query.statuses:
        terms["event_status"] = {"$in": list(query.statuses)}
    if query.event_type is not None:
        terms["event_type"] = query.event_type
    if query.partner_id is not None:
        terms[PARTNER] = query.partner_id
    if query.entity_type is not None:
        terms[ENTITY_TYPE] = query.entity_type
    if query.entity_id is not None:
        terms[ENTITY_ID] = query.entity_id
    created = _created_range(query)
    if created:
        terms["created"] = created
    if query.retryable is not None:
        terms["retryable"] = True if query.retryable else {"$ne": True}
    if query.below_attempt is not None:
        terms[f"{HISTORY_KEY}.{query.below_attempt}"] = {"$exists": False}
    if query.min_attempts is not None:
        terms["attempts"] = {"$gte": query.min_attempts}
    if query.dead_lettered is not None:
        terms["dead_lettered"] = {"$exists": query.dead_lettered}
    return terms


def _created_range(query: EventQuery) -> dict[str, str]:
    bounds = {}
    if query.since is not None:
        bounds["$gte"] = documents.epoch_ms(query.since)
    if query.until is not None:
        bounds["$lt"] = documents.epoch_ms(query.until)
    return bounds


def matches(record: Mapping[str, Any], query: EventQuery) -> bool:
    """Return True when ``record`` matches ``query`` (what ``query_filter`` asks the server)."""
    checks = (
        not documents.is_entity(record),
        not query.statuses or record.get("event_status") in query.statuses,
        query.event_type is None or record.get("event_type") == query.event_type,
        query.partner_id is None or lookup(record, PARTNER) == query.partner_id,
        query.entity_type is None or lookup(record, ENTITY_TYPE) == query.entity_type,
        query.entity_id is None or lookup(record, ENTITY_ID) == query.entity_id,
        _in_range(record.get("created"), query),
        query.retryable is None or (record.get("retryable") is True) == query.retryable,
        query.below_attempt is None or not _has_attempt(record, query.below_attempt),
        query.min_attempts is None or _attempts(record) >= query.min_attempts,
        query.dead_lettered is None or ("dead_lettered" in record) == query.dead_lettered,
    )
    return all(checks)


def _in_range(created: Any, query: EventQuery) -> bool:
    # The server compares text with text only: a record without a text
    # ``created`` never matches a bounded query.
    bounds = _created_range(query)
    if not bounds:
        return True
    if not isinstance(created, str):
        return False
    return created >= bounds.get("$gte", "") and ("$lt" not in bounds or created < bounds["$lt"])


def _has_attempt(record: Mapping[str, Any], number: int) -> bool:
    history = lookup(record, HISTORY_KEY)
    return isinstance(history, Mapping) and str(number) in history


def _attempts(record: Mapping[str, Any]) -> float:
    value = record.get("attempts")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return float("-inf")


def created_bucket(created: Any, bucket_ms: int) -> int | None:
    """Return the start of ``created``'s bucket in epoch ms; None when it is not a number."""
    if not isinstance(created, str) or not created.isascii() or not created.isdigit():
        return None
    stamp = int(created)
    return stamp - stamp % bucket_ms


def sort_key(order: Order) -> Any:
    """Return the Python sort key of ``order`` (descending), as the server sorts."""
    if order == "attempts":
        return lambda record: (_attempts(record), _text(record.get("created")))
    return lambda record: _text(record.get("created"))


def _text(value: Any) -> str:
    # Missing or non-text ``created`` sorts last in a descending sort, as on the server.
    return value if isinstance(value, str) else ""


def replay_pipeline(entry: Mapping[str, Any], now: datetime, *, reopen: bool,
                    redrive_at: datetime | None = None) -> list[dict[str, Any]]:
    """Return the update pipeline of ``record_replay``: append the entry, maybe reopen."""
    done: dict[str, Any] = {
        "replays": {"$concatArrays": [{"$ifNull": ["$replays", []]},
                                      [{"$literal": dict(entry)}]]},
    }
    if reopen:
        # The processor counts the attempt cap from replayed_at_attempt, so a
        # reopened record gets a fresh set of attempts; retryable makes it claimable.
        # A replay runs now: a deferral (NOT_BEFORE) no longer holds it back.
        done.update(retryable=True, replayed_at_attempt={"$ifNull": ["$attempts", 0]},
                    lastUpdatedTime=documents.epoch_ms(now), **{documents.NOT_BEFORE: "$$REMOVE"})
        if redrive_at is not None:
            # The sweeper spends ``redrives - parks``: starting redrives at the parks
            # gives the reopened record a fresh budget without forgetting its parks.
            done.update(redrive_at={"$literal": documents.bson_time(redrive_at)},
                        redrives={"$ifNull": ["$parks", 0]})
    return [{"$set": done}]


def replay_filter(key: str, *, reopen: bool) -> dict[str, Any]:
    """Return the filter of ``record_replay``: the key, and FAILED when it reopens."""
    terms = documents.key_filter(key)
    if reopen:
        terms["event_status"] = documents.FAILED
    return terms
