"""Operator summaries: the fields a cascade view reads of each event."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eventbus.model.forward import is_forward

SUMMARY_FIELDS = ("idempotency_key", "event_type", "event_status", "retryable", "error",
                  "outbox", "root_key", "stale", "rebuild_made")
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
