"""What happened to one delivery; ``eventbus.web.status`` maps each to an HTTP status."""

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

    @property
    def acked(self) -> bool:
        """True when Pub/Sub must stop delivering the message."""
        return self in {Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.REJECTED}
