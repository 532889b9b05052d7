"""The named error hierarchy and the one function that classifies exceptions.

A handler that returns acks its message; a handler that raises nacks it,
unless the exception says the message can never succeed. Classification is
done by a ``Classifier`` that each processor owns: everything that is not
known to be permanent is transient, so an unexpected bug is retried, never
dropped.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

E = TypeVar("E", bound=BaseException)


def caused_by(exc: BaseException | None, kind: type[E]) -> E | None:
    """The ``kind`` that ``exc`` is or was raised ``from`` (a handler may wrap it), or None.

    Walks ``__cause__`` (a cycle ends the walk): how the processor finds a park or a
    ``RetryAfter`` under a handler's own error, and partners a partner-wide one.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None


class EventBusError(Exception):
    """Base class of every error this framework raises on purpose."""


class TransientError(EventBusError):
    """Raised when an operation failed but may succeed if retried later.

    Pub/Sub gets a 503 and redelivers with backoff.
    """


class StoreUnavailable(TransientError):
    """Raised when MongoDB cannot be reached or times out."""


class LeaseHeld(TransientError):
    """Raised when another worker holds a live lease on the same idempotency key."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        super().__init__(f"event {record.get('idempotency_key')!r} is being processed elsewhere")
        self.record = record


class RetryAfter(TransientError):
    """Raised by a handler (or a partner client) that knows when the event is worth running
    again: ``raise RetryAfter(120, "partner asked")`` or ``RetryAfter(a_datetime, ...)``.

    The processor stores the event FAILED-retryable with ``redrive_at`` at that time on
    the store's clock, answers 2xx (the push is acked, a pull acked), and the
    store-driven redrive brings it back then, not before. Unlike a park, the attempt
    counts: past ``Settings.max_attempts`` the event is FAILED for good, so nothing is
    retried forever. Any value is bounded (``delay``): never an exception.
    """

    classification = "retry_after"
    SHORTEST = 1.0
    """The shortest wait in seconds: a negative, zero, NaN or past value waits this long."""

    def __init__(self, when: Any, reason: str = "", *, partner_wide: bool = False) -> None:
        """``partner_wide``: the partner asked every caller to wait (a 429's ``Retry-After``),
        so its breaker pauses its other calls until then too (``eventbus.partners``)."""
        super().__init__(f"retry after {when!r}: {reason}" if reason else f"retry after {when!r}")
        self.when, self.reason, self.partner_wide = when, reason, partner_wide

    def delay(self, now: datetime, longest: float) -> float:
        """Seconds from ``now`` until the event may run again, within [SHORTEST, longest].

        ``when`` is seconds (a number, or text such as ``"120"``), or a datetime (a
        naive one is UTC). Anything else (garbage, NaN, infinities, a date in the past,
        a year ahead) is bounded, never an error.
        """
        seconds = _seconds_until(self.when, now)
        if seconds is None or seconds != seconds:  # not a time, or NaN
            seconds = self.SHORTEST
        return min(max(seconds, self.SHORTEST), max(longest, self.SHORTEST))


def _seconds_until(when: Any, now: datetime) -> float | None:
    """Seconds from ``now`` to ``when`` (seconds or a datetime); None: neither."""
    if isinstance(when, datetime):
        moment = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        return (moment - now).total_seconds()
    if isinstance(when, bool):
        return None
    try:
        return float(when)
    except (TypeError, ValueError, OverflowError):
        return None


class PublishError(TransientError):
    """Raised when a message could not be published to Pub/Sub."""


class PartnerPaused(TransientError):
    """Raised instead of a partner call its breaker, rate or bulkhead does not let through.

    The processor parks the event: FAILED-retryable with ``partner`` and
    ``until`` in its error, ``redrive_at`` at ``until``, acked, and no attempt
    spent (``eventbus.partners``). ``until`` is a timezone-aware datetime.
    """

    classification = "parked"

    def __init__(self, partner: str, until: Any, why: str) -> None:
        super().__init__(f"partner {partner!r} paused until {until:%Y-%m-%dT%H:%M:%S}Z: {why}")
        self.partner, self.until, self.why = partner, until, why


class BreakerOpen(PartnerPaused):
    """Raised when the partner's breaker is open (or half-open with its probe out)."""


class RateLimited(PartnerPaused):
    """Raised when the partner's shared rate is spent for longer than a brief wait."""


class BulkheadFull(PartnerPaused):
    """Raised when the partner's bulkhead (its calls in flight in this process) stayed full."""


class PermanentError(EventBusError):
    """Raised when a message can never succeed; it is stored as FAILED and acked."""


class Expired(PermanentError):
    """An event older than its route's ``max_age`` (on the store's clock): never run, stored
    FAILED for good with the classification ``expired``, acked."""


class InvalidEvent(PermanentError):
    """Raised when a delivered payload is not a valid event (bad JSON, missing or bad fields)."""


class ContentProblem(InvalidEvent):
    """Raised when a payload holds what no store keeps (too deep, too large, bad text)."""


class EventTooLarge(ContentProblem, PublishError):
    """Raised by a publisher, before sending, for an event larger than the service stores.

    ``size`` is the event's size as the receiver counts it, ``limit`` the most
    it takes: once stored (``eventbus.model.content.MAX_BYTES``, with the
    message's Pub/Sub metadata) or on Pub/Sub (``PUBSUB_MAX_DATA_BYTES``).
    Nothing was sent. It is a ``PublishError``, for callers that catch what
    publishing raises, and an ``InvalidEvent`` (permanent): sending the same
    event again fails the same way, so it is never retried.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size, self.limit = size, limit


class ForgedLink(InvalidEvent):
    """Raised when a message claims to be a child that no SUCCESS parent's outbox lists."""


class InternalOnly(InvalidEvent):
    """Raised when an internal event type arrives from outside the relay."""


class UnknownEventType(InvalidEvent):
    """Raised when no handler is registered for the event's ``event_type``."""


class UnsupportedVersion(InvalidEvent):
    """Raised when the event's ``event_version`` has no handler and no upcaster."""


class AttemptCapReached(PermanentError):
    """Raised when an event has used all its attempts (``EVENTBUS_MAX_ATTEMPTS``)."""


class ReplayRefused(PermanentError):
    """Raised in replay mode for a call a rebuild may not make (``eventbus.model.rebuild_policy``).

    A guarded call that never succeeded before, or a partner call outside the
    guard, without the operator's ``--allow-new-calls``: that event's rebuild
    fails with this reason; its earlier SUCCESS stays.
    """


class RequestError(EventBusError):
    """Raised when an HTTP request is not a Pub/Sub delivery; it is never processed."""

    status = 400
    code = "bad_request"


class PayloadTooLarge(RequestError):
    """Raised when a request body is larger than a Pub/Sub push can be."""

    status = 413
    code = "payload_too_large"


class Unauthenticated(RequestError):
    """Raised when a push request carries no valid OIDC bearer token."""

    status = 401
    code = "unauthenticated"


class Forbidden(RequestError):
    """Raised when a valid token belongs to an identity that may not push here."""

    status = 403
    code = "forbidden"


class AlreadyExists(EventBusError):
    """Raised by the store when the idempotency key exists and cannot be claimed.

    It carries the stored record, so the caller decides without another read.
    """

    def __init__(self, record: Mapping[str, Any]) -> None:
        super().__init__(f"event {record.get('idempotency_key')!r} already exists")
        self.record = record


class Conflict(AlreadyExists):
    """Raised by the store when a different payload arrives under a claimed key.

    The payload's fingerprint differs from the stored one: the message is
    recorded as a conflict and never runs or overwrites the record.
    """


class ContentRejected(EventBusError):
    """Raised by a store that refused a document for its content, not for being unreachable.

    Never transient: retrying the same content fails the same way, so the
    processor stores the message FAILED for good in a bounded form instead.
    """


class DuplicateHandler(EventBusError):
    """Raised when a second handler is registered for the same ``event_type``."""


class Classification(enum.Enum):
    """How a failure is treated: retried by the broker, or stored and acked."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


Predicate = Callable[[BaseException], bool]
logger = logging.getLogger("eventbus")


class Classifier:
    """Decides, per instance, which failures are permanent; everything else is transient.

    ``permanent`` lists exception types that can never succeed on a retry
    (``PermanentError`` always counts); ``predicates`` add rules that need
    more than a type (a driver error code, say). The processor owns one, so
    two services in one process can classify differently.
    """

    def __init__(self, permanent: tuple[type[BaseException], ...] = (),
                 predicates: tuple[Predicate, ...] = ()) -> None:
        self.permanent: tuple[type[BaseException], ...] = (PermanentError, *permanent)
        self.predicates = predicates

    def classify(self, exc: BaseException) -> Classification:
        """Return how ``exc`` is treated. Unknown exceptions are transient.

        A predicate that raises (one written for a driver's errors, reading
        ``exc.code`` of an exception that has none) does not match: the
        failure stays transient, retried and bounded, rather than escaping.
        """
        if isinstance(exc, self.permanent) or any(_matches(rule, exc)
                                                  for rule in self.predicates):
            return Classification.PERMANENT
        return Classification.TRANSIENT


def _matches(rule: Predicate, exc: BaseException) -> bool:
    try:
        return bool(rule(exc))
    except Exception:
        logger.warning("classifier predicate %r raised for %s; taken as no match",
                       rule, type(exc).__name__, exc_info=True)
        return False
