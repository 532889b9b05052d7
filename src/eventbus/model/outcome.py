"""What happened to one delivery; ``eventbus.web.http_status`` maps each to an HTTP status."""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """The result of processing one delivery."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    RETRY = "retry"
    IN_PROGRESS = "in_progress"
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    """A different payload under a claimed key: recorded, never run (acked)."""
    LEASE_LOST = "lease_lost"
    """The handler ran but another worker took the lease meanwhile (503: it decides)."""
    PARKED = "parked"
    """The partner's breaker or rate paused the call: stored FAILED-retryable, parked, acked."""
    STALE = "stale"
    """An ordered handler's event older than one applied for its entity: stored SUCCESS
    as stale, never run (acked)."""

    @property
    def acked(self) -> bool:
        """True when Pub/Sub must stop delivering the message."""
        return self in {Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.REJECTED, Outcome.CONFLICT,
                        Outcome.PARKED, Outcome.STALE}
