"""The named error hierarchy and the one function that classifies exceptions.

A handler that returns acks its message; a handler that raises nacks it,
unless the exception says the message can never succeed. Classification is
done by predicates in ``classify``: everything that is not known to be
permanent is transient, so an unexpected bug is retried, never dropped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any


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


class PublishError(TransientError):
    """Raised when a message could not be published to Pub/Sub."""


class PartnerUnavailable(TransientError):
    """Raised when a partner endpoint answered 408, 429, 5xx or could not be reached."""


class PermanentError(EventBusError):
    """Raised when a message can never succeed; it is stored as FAILED and acked."""


class InvalidEvent(PermanentError):
    """Raised when a delivered payload is not a valid event (bad JSON, missing or bad fields)."""


class UnknownEventType(InvalidEvent):
    """Raised when no handler is registered for the event's ``event_type``."""


class UnsupportedVersion(InvalidEvent):
    """Raised when the event's ``event_version`` has no handler and no upcaster."""


class PartnerRejected(PermanentError):
    """Raised when a partner endpoint answered a 4xx other than 408 and 429."""


class AttemptCapReached(PermanentError):
    """Raised when an event has used all its attempts (``EVENTBUS_MAX_ATTEMPTS``)."""


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


class DuplicateHandler(EventBusError):
    """Raised when a second handler is registered for the same ``event_type``."""


class Classification(enum.Enum):
    """How a failure is treated: retried by the broker, or stored and acked."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


Predicate = Callable[[BaseException], bool]

PERMANENT_PREDICATES: list[Predicate] = [
    lambda exc: isinstance(exc, PermanentError),
]


def classify(exc: BaseException) -> Classification:
    """Return how ``exc`` is treated. Unknown exceptions are transient."""
    if any(predicate(exc) for predicate in PERMANENT_PREDICATES):
        return Classification.PERMANENT
    return Classification.TRANSIENT
