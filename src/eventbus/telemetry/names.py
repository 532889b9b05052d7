"""The names the service's telemetry exports: metrics and span attributes.

They share the ``eventbus.`` prefix with the library's modules but name
signals, not code; ``NAMES`` lists them (the docs test accepts them).
"""

from __future__ import annotations

EVENTS = "eventbus.events"
HANDLER_DURATION = "eventbus.handler.duration"
END_TO_END = "eventbus.event.end_to_end"
ATTEMPTS = "eventbus.event.attempts"
OUTBOX_AGE = "eventbus.outbox.oldest_pending_age"
METRICS = (EVENTS, HANDLER_DURATION, END_TO_END, ATTEMPTS, OUTBOX_AGE)
"""Metric names (Prometheus: dots become underscores, plus the unit and ``_total``)."""

EVENT_TYPE = "eventbus.event_type"
IDEMPOTENCY_KEY = "eventbus.idempotency_key"
ATTEMPT = "eventbus.attempt"
OUTCOME = "eventbus.outcome"
ATTRIBUTES = (EVENT_TYPE, IDEMPOTENCY_KEY, ATTEMPT, OUTCOME)
"""Span attributes of the ``message`` and ``publish`` spans."""

NAMES = frozenset(METRICS + ATTRIBUTES)
