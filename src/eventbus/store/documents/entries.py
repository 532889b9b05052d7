"""Outbox entries in their parent's record: pending, published, failed to publish."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eventbus.store.documents.records import PENDING, PUBLISHED, bson_time


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
