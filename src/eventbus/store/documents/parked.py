"""Parked events: FAILED-retryable records waiting for a partner, and how often they waited.

A partner's breaker, rate or bulkhead refuses a call with ``PartnerPaused``; the
processor stores the event FAILED-retryable with the classification ``parked``
and counts the park (``parks``), which spends no attempt. The partners feature
(``eventbus.partners``) decides when they go again; these are the stored facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventbus.model.status import Status

FAILED = Status.FAILED.value
PARKED = "parked"
"""The ``error.classification`` of a parked event."""


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
