"""The idempotency state machine, written once over the store's primitives.

prepare (once per message) → claim → dispatch → finish. Each step's failure
has exactly one outcome; ``eventbus.web.status`` turns outcomes into status codes.

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

May import: ``eventbus.model``, ``eventbus.store.base``/``documents``, ``eventbus.guard``
and ``eventbus.settings``. Never Flask, pymongo or a Google client.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from eventbus.guard import Guard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import (
    AlreadyExists,
    AttemptCapReached,
    Classification,
    Classifier,
    InvalidEvent,
    StoreUnavailable,
)
from eventbus.model.event import Event, parse_event
from eventbus.model.keys import cascade_links, idempotency_key, rejected_key
from eventbus.model.outcome import Outcome
from eventbus.model.router import Route, Router
from eventbus.model.status import Status
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import Claim, EventStore

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


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Everything computed once per message before the claim: event, key, links, fields."""

    delivery: Delivery
    event: Event
    route: Route
    key: str
    root_key: str
    fields: dict[str, Any]


class Processor:
    """Runs one delivery through the state machine against a store and a router."""

    def __init__(self, store: EventStore, router: Router, settings: Settings,
                 now: Clock, after_success: AfterSuccess | None = None,
                 classifier: Classifier | None = None) -> None:
        self.store, self.router, self.settings, self.now = store, router, settings, now
        self.after_success = after_success
        self.classifier = classifier or Classifier()
        self.guard = Guard(store, lease=store.lease, now=now)

    def process(self, delivery: Delivery, request_id: str = "") -> Result:
        """Process ``delivery``; never raises for anything a message can contain."""
        try:
            return self._process(delivery, request_id or uuid.uuid4().hex)
        except StoreUnavailable as exc:
            logger.warning("store unavailable: %s", exc)
            return Result(Outcome.UNAVAILABLE, error=str(exc))

    def _process(self, delivery: Delivery, request_id: str) -> Result:
        links = cascade_links(delivery.attributes)
        try:
            prepared = self._prepare(delivery, links)
        except _Invalid as invalid:
            return self._reject(delivery, invalid.error, invalid.event, links)
        try:
            claim = self.store.claim(prepared.key, prepared.fields, self.now())
        except AlreadyExists as exc:
            return _existing(exc.record, prepared.key, prepared.event.event_type)
        return self._run(prepared, claim, request_id)

    def _prepare(self, delivery: Delivery, links: dict[str, str]) -> Prepared:
        event: Event | None = None
        try:
            if delivery.decode_error:
                raise InvalidEvent(delivery.decode_error)
            event = parse_event(delivery.data, delivery.attributes)
            route = self.router.route_for(event)
            key = idempotency_key(event, delivery.attributes)
        except InvalidEvent as exc:
            raise _Invalid(exc, event) from None
        fields = documents.event_fields(event, delivery, **links)
        return Prepared(delivery, event, route, key, links.get("root_key") or key, fields)

    def _reject(self, delivery: Delivery, exc: InvalidEvent, event: Event | None,
                links: dict[str, str]) -> Result:
        key = _safe_key(event, delivery)
        raw = delivery.data.decode("utf-8", "replace")
        fields = documents.event_fields(event, delivery, **links)
        self.store.reject(key, fields, self.now(),
                          documents.error_document(exc, "invalid"), raw_payload=raw)
        logger.error("rejected message %s: %s", delivery.message_id, exc)
        return Result(Outcome.REJECTED, key=key, error=str(exc),
                      event_type=event.event_type if event else "")

    def _run(self, prepared: Prepared, claim: Claim, request_id: str) -> Result:
        if claim.attempt > self.settings.max_attempts:
            return self._fail(prepared, claim, AttemptCapReached("attempt cap reached"))
        try:
            context = self._context(prepared, claim, request_id)
            prepared.route.handler(context)
        except Exception as exc:  # classified below: unknown means transient
            return self._fail(prepared, claim, exc)
        return self._succeed(prepared, claim, context)

    def _context(self, prepared: Prepared, claim: Claim, request_id: str) -> Context:
        log = logging.LoggerAdapter(logger, {"requestId": request_id,
                                             "idempotency_key": prepared.key})
        return Context(event=prepared.route.upcast(prepared.event), key=prepared.key,
                       attempt=claim.attempt, delivery=prepared.delivery, log=log,
                       db=self.store.database, now=self.now, root_key=prepared.root_key,
                       guard=self.guard)

    def _succeed(self, prepared: Prepared, claim: Claim, context: Context) -> Result:
        now, key = self.now(), prepared.key
        outbox = [child.to_document(key, context.root_key, documents.bson_time(now))
                  for child in context.children]
        if not self.store.succeed(key, claim.owner, now, outbox):
            logger.warning("lease on %s was lost before SUCCESS was stored", key)
        elif outbox and self.after_success is not None:
            _run_hook(self.after_success, key, outbox)
        return Result(Outcome.PROCESSED, key=key, event_type=prepared.event.event_type,
                      attempt=claim.attempt, children=len(outbox))

    def _fail(self, prepared: Prepared, claim: Claim, exc: Exception) -> Result:
        kind = self.classifier.classify(exc)
        final = kind is Classification.PERMANENT
        capped = claim.attempt >= self.settings.max_attempts and not final
        label = "attempt_cap" if capped else kind.value
        self.store.fail(prepared.key, claim.owner, self.now(),
                        documents.error_document(exc, label), retryable=not (final or capped))
        outcome = Outcome.REJECTED if final or capped else Outcome.RETRY
        (logger.error if outcome is Outcome.REJECTED else logger.warning)(
            "%s on %s attempt %d: %s", label, prepared.key, claim.attempt, exc)
        return Result(outcome, key=prepared.key, event_type=prepared.event.event_type,
                      attempt=claim.attempt, error=f"{type(exc).__name__}: {exc}")


class _Invalid(Exception):
    """A message that can never be an event, with the event when it got that far."""

    def __init__(self, error: InvalidEvent, event: Event | None) -> None:
        super().__init__(str(error))
        self.error, self.event = error, event


def _run_hook(hook: AfterSuccess, key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
    # SUCCESS is stored: whatever the hook does, the message is processed and
    # must be acked; the outbox keeps what the hook did not finish.
    try:
        hook(key, outbox)
    except Exception:
        logger.exception("after_success hook failed for %s; left to the sweeper", key)


def _existing(record: Mapping[str, Any], key: str, event_type: str) -> Result:
    status = record.get("event_status")
    outcome = Outcome.IN_PROGRESS if status == Status.PROCESSING else Outcome.DUPLICATE
    return Result(outcome, key=key, event_type=event_type, attempt=int(record.get("attempts", 0)))


def _safe_key(event: Event | None, delivery: Delivery) -> str:
    if event is not None:
        try:
            return idempotency_key(event, delivery.attributes)
        except InvalidEvent:
            pass
    return rejected_key(delivery.data, delivery.attributes, delivery.message_id)
