"""The idempotency state machine, written once over the store's primitives.

validate → claim → dispatch → finish. Each step's failure has exactly one
outcome; ``eventbus.http`` turns outcomes into status codes.

* record already SUCCESS, or FAILED for good   → DUPLICATE (ack, handler not run)
* record PROCESSING under a live lease          → IN_PROGRESS (503, redelivered later)
* new, retryable, or lease expired              → claimed, the handler runs
* handler returned                              → SUCCESS (+ outbox) → PROCESSED;
                                                  then ``after_success`` (the inline relay),
                                                  whose failures never change the outcome
* handler raised a transient error              → FAILED retryable → RETRY (503)
* handler raised a permanent error, or the attempt cap is reached
                                                → FAILED for good → REJECTED (ack)
* payload can never be an event                 → stored FAILED with raw payload → REJECTED
* the store is unreachable                      → UNAVAILABLE (503), nothing changed
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from eventbus import records
from eventbus.config import Settings
from eventbus.context import Context
from eventbus.envelope import Delivery
from eventbus.errors import (
    AlreadyExists,
    AttemptCapReached,
    Classification,
    InvalidEvent,
    StoreUnavailable,
    classify,
)
from eventbus.event import Event, parse_event
from eventbus.keys import cascade_links, idempotency_key, rejected_key
from eventbus.outcome import Outcome
from eventbus.router import Route, Router
from eventbus.store import Claim, MongoEventStore

logger = logging.getLogger("eventbus")

AfterSuccess = Callable[[str, Sequence[Mapping[str, Any]]], None]


class Clock(Protocol):
    """Returns the current time, timezone-aware; tests pass a fake to move time."""

    def __call__(self) -> datetime:
        """Return the current time."""
        ...


@dataclasses.dataclass
class Result:
    """What processing one delivery did, for the response and the request log."""

    outcome: Outcome
    key: str = ""
    event_type: str = ""
    attempt: int = 0
    error: str = ""
    children: int = 0


class Processor:
    """Runs one delivery through the state machine against a store and a router."""

    def __init__(self, store: MongoEventStore, router: Router, settings: Settings,
                 now: Clock, after_success: AfterSuccess | None = None) -> None:
        self.store, self.router, self.settings, self.now = store, router, settings, now
        self.after_success = after_success

    def process(self, delivery: Delivery, request_id: str = "") -> Result:
        """Process ``delivery``; never raises for anything a message can contain."""
        try:
            return self._process(delivery, request_id or uuid.uuid4().hex)
        except StoreUnavailable as exc:
            logger.warning("store unavailable: %s", exc)
            return Result(Outcome.UNAVAILABLE, error=str(exc))

    def _process(self, delivery: Delivery, request_id: str) -> Result:
        try:
            event = self._parse(delivery)
        except InvalidEvent as exc:
            return self._reject(delivery, exc, None)
        try:
            route = self.router.route_for(event)
            key = idempotency_key(event, delivery.attributes)
        except InvalidEvent as exc:
            return self._reject(delivery, exc, event)
        try:
            fields = records.event_fields(event, delivery, **cascade_links(delivery.attributes))
            claim = self.store.claim(key, fields, self.now())
        except AlreadyExists as exc:
            return _existing(exc.record, key, event.event_type)
        return self._run(route, event, key, claim, delivery, request_id)

    @staticmethod
    def _parse(delivery: Delivery) -> Event:
        if delivery.decode_error:
            raise InvalidEvent(delivery.decode_error)
        return parse_event(delivery.data, delivery.attributes)

    def _reject(self, delivery: Delivery, exc: InvalidEvent, event: Event | None) -> Result:
        key = _safe_key(event, delivery)
        raw = delivery.data.decode("utf-8", "replace")
        fields = records.event_fields(event, delivery, **cascade_links(delivery.attributes))
        self.store.reject(key, fields, self.now(),
                          records.error_document(exc, "invalid"), raw_payload=raw)
        logger.error("rejected message %s: %s", delivery.message_id, exc)
        return Result(Outcome.REJECTED, key=key, error=str(exc),
                      event_type=event.event_type if event else "")

    def _run(self, route: Route, event: Event, key: str, claim: Claim,
             delivery: Delivery, request_id: str) -> Result:
        if claim.attempt > self.settings.max_attempts:
            return self._fail(key, claim, event, AttemptCapReached("attempt cap reached"))
        try:
            context = self._context(route.upcast(event), key, claim, delivery, request_id)
            route.handler(context)
        except Exception as exc:  # classified below: unknown means transient
            return self._fail(key, claim, event, exc)
        return self._succeed(key, claim, event, context)

    def _context(self, event: Event, key: str, claim: Claim, delivery: Delivery,
                 request_id: str) -> Context:
        log = logging.LoggerAdapter(logger, {"requestId": request_id, "idempotency_key": key})
        root = cascade_links(delivery.attributes).get("root_key") or key
        return Context(event=event, key=key, attempt=claim.attempt, delivery=delivery, log=log,
                       db=self.store.database, now=self.now, root_key=root,
                       settings=self.settings)

    def _succeed(self, key: str, claim: Claim, event: Event, context: Context) -> Result:
        now = self.now()
        outbox = [child.to_document(key, context.root_key, records.bson_time(now))
                  for child in context.children]
        if not self.store.succeed(key, claim.owner, now, outbox):
            logger.warning("lease on %s was lost before SUCCESS was stored", key)
        elif outbox and self.after_success is not None:
            _run_hook(self.after_success, key, outbox)
        return Result(Outcome.PROCESSED, key=key, event_type=event.event_type,
                      attempt=claim.attempt, children=len(outbox))

    def _fail(self, key: str, claim: Claim, event: Event, exc: Exception) -> Result:
        final = classify(exc) is Classification.PERMANENT
        capped = claim.attempt >= self.settings.max_attempts and not final
        kind = "attempt_cap" if capped else classify(exc).value
        self.store.fail(key, claim.owner, self.now(), records.error_document(exc, kind),
                        retryable=not (final or capped))
        outcome = Outcome.REJECTED if final or capped else Outcome.RETRY
        (logger.error if outcome is Outcome.REJECTED else logger.warning)(
            "%s on %s attempt %d: %s", kind, key, claim.attempt, exc)
        return Result(outcome, key=key, event_type=event.event_type,
                      attempt=claim.attempt, error=f"{type(exc).__name__}: {exc}")


def _run_hook(hook: AfterSuccess, key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
    # SUCCESS is stored: whatever the hook does, the message is processed and
    # must be acked; the outbox keeps what the hook did not finish.
    try:
        hook(key, outbox)
    except Exception:
        logger.exception("after_success hook failed for %s; left to the sweeper", key)


def _existing(record: Mapping[str, Any], key: str, event_type: str) -> Result:
    status = record.get("event_status")
    outcome = Outcome.IN_PROGRESS if status == "PROCESSING" else Outcome.DUPLICATE
    return Result(outcome, key=key, event_type=event_type, attempt=int(record.get("attempts", 0)))


def _safe_key(event: Event | None, delivery: Delivery) -> str:
    if event is not None:
        try:
            return idempotency_key(event, delivery.attributes)
        except InvalidEvent:
            pass
    return rejected_key(delivery.data, delivery.attributes, delivery.message_id)
