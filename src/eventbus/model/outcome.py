"""What happened to one delivery, and each outcome's facts in one table (``FACTS``).

Every place that acts on an outcome reads its row here: the push answer's
HTTP status (``eventbus.web.http_status``: 2xx acks, anything else makes
Pub/Sub redeliver with backoff), the pull worker's ack or nack and its
request line, the error classification a body carries, the request line's
log level, and whether a rebuild runs the event again in the same run.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType


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
    DEFERRED = "deferred"
    """The handler (or its partner) said when to come back (``RetryAfter``): stored
    FAILED-retryable with its time, the attempt spent, acked; the redrive brings it back."""
    STALE = "stale"
    """An ordered handler's event older than one applied for its entity: stored SUCCESS
    as stale, never run (acked)."""

    @property
    def facts(self) -> Facts:
        """This outcome's row of ``FACTS``."""
        return FACTS[self]

    @property
    def acked(self) -> bool:
        """True when Pub/Sub must stop delivering the message (its status is a 2xx)."""
        return FACTS[self].status < 300


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one outcome means to Pub/Sub, to a response body, to the logs and to a rebuild."""

    status: int
    """The push answer's HTTP status; under 300 acks (pull: ack, else nack)."""
    level: int
    """The request line's log level when the answer is this status."""
    classification: str | None = None
    """The error classification a response body carries; None: no error."""
    final: bool = False
    """Nothing runs the event again by itself: its record is settled (a redelivery is a
    duplicate). Not final: Pub/Sub redelivers it (a nack) or the store redrives it."""
    again: bool = False
    """A rebuild runs the event again in the same run (its entity busy, the store away)."""
    failed: bool = False
    """The attempt failed: the message's span ends with an error status (telemetry)."""
    settles: bool = False
    """This delivery settled the event: its attempts and its publish-to-settle time are
    measured (a duplicate or a conflict settled nothing; a retry, nothing yet)."""


FACTS: Mapping[Outcome, Facts] = MappingProxyType({
    Outcome.PROCESSED: Facts(200, logging.INFO, final=True, settles=True),
    Outcome.DUPLICATE: Facts(200, logging.INFO, final=True),
    # Acked: the record is FAILED for good; an operator's attention, hence ERROR.
    Outcome.REJECTED: Facts(200, logging.ERROR, "permanent", final=True, failed=True,
                             settles=True),
    Outcome.RETRY: Facts(503, logging.WARNING, "transient", failed=True),
    Outcome.IN_PROGRESS: Facts(503, logging.WARNING, "in_progress", again=True),
    Outcome.UNAVAILABLE: Facts(503, logging.WARNING, "store_unavailable", again=True,
                                failed=True),
    Outcome.CONFLICT: Facts(200, logging.INFO, "conflict", final=True),
    Outcome.LEASE_LOST: Facts(503, logging.WARNING, "lease_lost", again=True, failed=True),
    # Acked, not final: the store redrives a parked event when its partner takes calls
    # again, and a 503 would slow every other partner's pushes.
    Outcome.PARKED: Facts(200, logging.INFO, "parked"),
    # Acked, not final, as a park is: the store redrives it at the time it was given.
    Outcome.DEFERRED: Facts(200, logging.INFO, "retry_after"),
    Outcome.STALE: Facts(200, logging.INFO, final=True, settles=True),
})
"""Each outcome's facts: the one table (issue 41)."""
