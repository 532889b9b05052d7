"""The names the service's telemetry exports: metrics, span and metric attributes.

OpenTelemetry's messaging conventions name what they cover (messages consumed,
processing time, system, message id, error type); what they do not name carries
the ``eventbus.`` prefix. ``NAMES`` lists them (the docs test accepts them).
"""

from __future__ import annotations

CONSUMED = "messaging.client.consumed.messages"
PROCESS_DURATION = "messaging.process.duration"
END_TO_END = "eventbus.event.end_to_end"
ATTEMPTS = "eventbus.event.attempts"
OUTBOX_AGE = "eventbus.outbox.oldest_pending_age"
BREAKER_STATE = "eventbus.partner.breaker_state"
BREAKER_OPEN_FOR = "eventbus.partner.open_for"
PARKED = "eventbus.partner.parked"
METRICS = (CONSUMED, PROCESS_DURATION, END_TO_END, ATTEMPTS, OUTBOX_AGE, BREAKER_STATE,
           BREAKER_OPEN_FOR, PARKED)
"""Metric names (Prometheus: dots become underscores, plus the unit and ``_total``)."""

SYSTEM = "messaging.system"
OPERATION = "messaging.operation.type"
MESSAGE_ID = "messaging.message.id"
ERROR_TYPE = "error.type"
EVENT_TYPE = "eventbus.event_type"
IDEMPOTENCY_KEY = "eventbus.idempotency_key"
ATTEMPT = "eventbus.attempt"
OUTCOME = "eventbus.outcome"
PARTNER = "eventbus.partner"
ATTRIBUTES = (SYSTEM, OPERATION, MESSAGE_ID, ERROR_TYPE, EVENT_TYPE, IDEMPOTENCY_KEY, ATTEMPT,
              OUTCOME, PARTNER)
"""Attributes of the ``message`` and ``publish`` spans and of the metrics' points."""

PUBSUB = "gcp_pubsub"
"""The value of ``messaging.system``."""

NAMES = frozenset(METRICS + ATTRIBUTES)
