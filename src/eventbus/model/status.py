"""The one status vocabulary of every stored record: events, outbox entries, guarded effects."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    """A record's state. Stored as its value, so documents read as plain strings.

    * events: PENDING → PROCESSING → SUCCESS | FAILED (retryable or for good);
    * outbox entries: PENDING → PUBLISHED;
    * guarded side effects: PROCESSING → SUCCESS | FAILED.
    """

    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    PUBLISHED = "PUBLISHED"
