"""Parked events and partner documents: the pure rules both stores and the layers above share.

A *parked* event is FAILED-retryable with an ``error`` whose classification
is ``parked``, naming the ``partner`` and the time it is brought back
(``until``, also its ``redrive_at``). The record's top-level ``parks`` counts
its parks so far (``$inc`` by each park's finish); no claim, unclaim or
failure erases it, so a parked claim spends neither an attempt nor a redrive
however its next claim ends.

The partners collection holds two kinds of documents: one breaker per
partner (``_id`` ``breaker/<name>``) and one per partner and rate window
(``_id`` ``rate/<name>/<window ms>``, deleted by the TTL index on ``expire_at``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eventbus.store.documents.records import FAILED

PARKED = "parked"
"""The ``error.classification`` of a parked event."""
BREAKER = "breaker"
RATE = "rate"


def parks(record: Mapping[str, Any] | None) -> int:
    """Return how many times ``record`` was parked (0 for None or a record never parked)."""
    count = (record or {}).get("parks")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def is_parked(record: Mapping[str, Any]) -> bool:
    """Return True when ``record`` is FAILED-retryable and parked."""
    error = record.get("error")
    return record.get("event_status") == FAILED and record.get("retryable") is True and \
        isinstance(error, Mapping) and error.get("classification") == PARKED


def parked_filter() -> dict[str, Any]:
    """Return the filter of parked records (``is_parked``'s server form)."""
    return {"event_status": FAILED, "retryable": True, "error.classification": PARKED}


def breaker_id(name: str) -> str:
    """Return the ``_id`` of partner ``name``'s breaker document."""
    return f"{BREAKER}/{name}"


def breaker_document(name: str, version: int, document: Mapping[str, Any]) -> dict[str, Any]:
    """Return the breaker document stored: ``document`` with its id, kind, name and version."""
    return {**document, "_id": breaker_id(name), "kind": BREAKER, "name": name,
            "version": version}


def rate_id(name: str, window: datetime) -> str:
    """Return the ``_id`` of partner ``name``'s rate document for the window at ``window``."""
    return f"{RATE}/{name}/{int(window.timestamp() * 1000)}"


def rate_insert(name: str, window: datetime, expires: datetime) -> dict[str, Any]:
    """Return the fields a new rate window document gets (``$setOnInsert``)."""
    return {"kind": RATE, "name": name, "window": window, "expire_at": expires}
