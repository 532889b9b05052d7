"""The state machine: locate once, claim, run under a renewed lease, finish.

See the package docstring for the outcomes. Every branch ends in one store
write (or none) and one ``Result``; ``eventbus.web.http_status`` maps results to
HTTP statuses.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from eventbus.correlation import tracecontext
from eventbus.guard import Guard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import (
    AlreadyExists,
    AttemptCapReached,
    Classification,
    Classifier,
    Conflict,
    ContentRejected,
    InvalidEvent,
    StoreUnavailable,
)
from eventbus.model.keys import conflict_key
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.model.status import Status
from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.intake import Intake, Located
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import Claim, EventStore
from eventbus.telemetry import Telemetry

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

    def __init__(self, store: EventStore, router: Router, settings: Settings,
                 now: Clock, after_success: AfterSuccess | None = None,
                 classifier: Classifier | None = None,
                 heartbeat: Heartbeat | None = None, telemetry: Telemetry | None = None) -> None:
        self.store, self.router, self.settings, self.now = store, router, settings, now
        router.check()  # a forward of an internal or unhandled type stops the app here
        self.telemetry = telemetry or Telemetry()
        self.after_success = after_success
        self.classifier = classifier or Classifier()
        self.guard = Guard(store, lease=store.lease, now=now)
        self.intake = Intake(store, router)
        self.heartbeat = heartbeat or Heartbeat(store, now=now)

    def locate(self, delivery: Delivery) -> Located:
        """Return the key and record fields ``delivery`` gets (see ``Intake.locate``)."""
        return self.intake.locate(delivery)

    def process(self, delivery: Delivery, request_id: str = "") -> Result:
        """Process ``delivery``; never raises for anything a message can contain."""
        request_id = request_id or uuid.uuid4().hex
        # Log lines group by the message's trace; with tracing on, its span's.
        scope = None if self.telemetry.tracing else tracecontext.adopt(
            tracecontext.message_trace(delivery.attributes), request_id)
        try:
            with self.telemetry.message(delivery, request_id) as observed:
                return observed.done(self._guarded(delivery, request_id))
        finally:
            tracecontext.leave(scope)

    def _guarded(self, delivery: Delivery, request_id: str) -> Result:
        try:
            return self._process(delivery, request_id)
        except StoreUnavailable as exc:
            logger.warning("store unavailable: %s", exc)
            return Result(Outcome.UNAVAILABLE, error=type(exc).__name__)

    def _process(self, delivery: Delivery, request_id: str) -> Result:
        located = self.intake.locate(delivery)
        if located.error is not None:
            return self._reject(located, located.error)
        try:
            with self.telemetry.claiming(_type(located)):
                claim = self.store.claim(located.key, located.fields, self.now())
        except Conflict as exc:
            return self._conflict(located, exc.record)
        except AlreadyExists as exc:
            return _existing(exc.record, located)
        except ContentRejected as exc:
            return self._reject(self.intake.refuse(delivery, located.event), exc)
        return self._run(located, claim, request_id)

    def _reject(self, located: Located, exc: Exception) -> Result:
        kind = "content" if isinstance(exc, ContentRejected) else "invalid"
        with self.telemetry.span("finish"):
            inserted = self._store_refused(located.key, located.fields,
                                           documents.error_document(exc, kind))
        if not inserted:
            return self._already_refused(located)
        logger.error("rejected message %s: %s", located.delivery.message_id, exc)
        return Result(Outcome.REJECTED, key=located.key, error=_brief(exc),
                      event_type=str(located.fields.get("event_type", "")))

    def _already_refused(self, located: Located) -> Result:
        # Stored before: the same message again is a duplicate; a different
        # payload under that key (an unknown type reusing a key) is a conflict.
        record = self.store.get(located.key) or {}
        if _other_payload(record, located):
            return self._conflict(located, record)
        return _existing(record, located)

    def _store_refused(self, key: str, fields: Mapping[str, Any],
                       error: Mapping[str, Any]) -> bool:
        try:
            return self.store.reject(key, fields, self.now(), error)
        except ContentRejected:
            # The bounded form itself was refused (a server stricter than the
            # checks): keep what surely fits, the key, the error and the hash.
            minimal = {name: fields[name] for name in documents.MINIMAL_FIELDS if name in fields}
            return self.store.reject(key, minimal, self.now(), error)

    def _conflict(self, located: Located, record: Mapping[str, Any]) -> Result:
        key = conflict_key(located.key, located.fingerprint)
        fields = {**self.intake.refuse(located.delivery, located.event).fields,
                  "conflicts_with": located.key}
        error = {"type": "Conflict", "classification": "conflict",
                 "message": "a different payload came under a key that is taken"}
        self._store_refused(key, fields, error)
        logger.error("conflict on %s: a different payload (message %s) recorded as %s",
                     located.key, located.delivery.message_id, key)
        return Result(Outcome.CONFLICT, key=located.key, error="Conflict",
                      event_type=str(record.get("event_type", "")))

    def _run(self, located: Located, claim: Claim, request_id: str) -> Result:
        assert located.route is not None and located.event is not None
        self.telemetry.claimed(claim)
        if self._attempts_used(claim) > self.settings.max_attempts:
            return self._fail(located, claim, AttemptCapReached("attempt cap reached"))
        try:
            context = self._context(located, claim, request_id)
            with self.heartbeat.keep(located.key, claim.owner) as lease, \
                    self.telemetry.handler(_type(located)):
                located.route.handler(context)
        except Exception as exc:  # classified below: unknown means transient
            return self._fail(located, claim, exc)
        if lease.lost:
            return _lease_lost(located, claim)
        return self._succeed(located, claim, context)

    def _attempts_used(self, claim: Claim) -> int:
        # A replay grants a fresh set of attempts: count from where it started.
        since = (claim.previous or {}).get("replayed_at_attempt", 0)
        return claim.attempt - (since if isinstance(since, int) else 0)

    def _context(self, located: Located, claim: Claim, request_id: str) -> Context:
        assert located.route is not None and located.event is not None
        log = logging.LoggerAdapter(logger, {"requestId": request_id,
                                             "idempotency_key": located.key})
        return Context(event=located.route.upcast(located.event), key=located.key,
                       attempt=claim.attempt, delivery=located.delivery, log=log,
                       db=self.store.database, now=self.now, root_key=located.root_key,
                       guard=self.guard)

    def _succeed(self, located: Located, claim: Claim, context: Context) -> Result:
        now, key = self.now(), located.key
        created = documents.bson_time(now)
        outbox: list[dict[str, Any]] = [child.to_document(key, context.root_key, created)
                                        for child in context.children]
        outbox += self.router.forwards.entries(context.event, key, context.root_key, created,
                                               (claim.previous or {}).get("outbox", ()))
        outbox = tracecontext.stamp(outbox, self.telemetry.emitting())
        try:
            with self.telemetry.span("finish"):
                stored = self.store.succeed(key, claim.owner, now, outbox)
        except ContentRejected as exc:  # the children's content: a handler bug
            return self._fail(located, claim, exc)
        if not stored:
            return _lease_lost(located, claim)
        if outbox and self.after_success is not None:
            with self.telemetry.span("relay"):
                _run_hook(self.after_success, key, outbox)
        return Result(Outcome.PROCESSED, key=key, event_type=_type(located),
                      attempt=claim.attempt, children=len(context.children))

    def _fail(self, located: Located, claim: Claim, exc: Exception) -> Result:
        kind = self.classifier.classify(exc)
        # A write the store refuses for its content (too large, a value it
        # cannot hold), the record's or a handler's own, fails the same way on
        # every retry: FAILED for good with the reason, not 503 until the cap.
        content = isinstance(exc, ContentRejected) or documents.refuses_content(exc)
        final = kind is Classification.PERMANENT or content
        capped = self._attempts_used(claim) >= self.settings.max_attempts and not final
        label = "attempt_cap" if capped else "content" if content else kind.value
        now = self.now()
        redrive_at = now + timedelta(seconds=self.settings.redrive_after_seconds)
        with self.telemetry.span("finish"):
            stored = self.store.fail(located.key, claim.owner, now,
                                     documents.error_document(exc, label),
                                     retryable=not (final or capped), redrive_at=redrive_at)
        if not stored:
            return _lease_lost(located, claim)
        outcome = Outcome.REJECTED if final or capped else Outcome.RETRY
        (logger.error if outcome is Outcome.REJECTED else logger.warning)(
            "%s on %s attempt %d: %s", label, located.key, claim.attempt, exc)
        return Result(outcome, key=located.key, event_type=_type(located),
                      attempt=claim.attempt, error=_brief(exc))


def _type(located: Located) -> str:
    return located.event.event_type if located.event is not None else ""


def _brief(exc: BaseException) -> str:
    """The error as answered over HTTP: its type and, for invalid input, what is wrong.

    Messages of other errors may name internal hosts (a store, a partner URL);
    they go to the logs only.
    """
    if isinstance(exc, InvalidEvent):
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return type(exc).__name__


def _lease_lost(located: Located, claim: Claim) -> Result:
    # Another worker holds the record now and decides its outcome; answering
    # 503 lets the broker ask again instead of acking what this worker did.
    logger.warning("lease on %s was lost before the outcome was stored", located.key)
    return Result(Outcome.LEASE_LOST, key=located.key, event_type=_type(located),
                  attempt=claim.attempt, error="LeaseLost")


def _other_payload(record: Mapping[str, Any] | None, located: Located) -> bool:
    if record is None or record.get("event_status") == Status.PROCESSING:
        return False
    stored = record.get("payload_fingerprint") or record.get("payload_sha256")
    # A refusal a corrected payload replaced is this key's payload too: its
    # redelivery is a duplicate, not a conflict.
    earlier = {entry.get("payload_fingerprint") for entry in record.get("rejections") or ()
               if isinstance(entry, Mapping)}
    return stored is not None and stored != located.fingerprint and \
        located.fingerprint not in earlier


def _run_hook(hook: AfterSuccess, key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
    # SUCCESS is stored: whatever the hook does, the message is processed and
    # must be acked; the outbox keeps what the hook did not finish.
    try:
        hook(key, outbox)
    except Exception:
        logger.exception("after_success hook failed for %s; left to the sweeper", key)


def _existing(record: Mapping[str, Any], located: Located) -> Result:
    status = record.get("event_status")
    outcome = Outcome.IN_PROGRESS if status == Status.PROCESSING else Outcome.DUPLICATE
    return Result(outcome, key=located.key, event_type=_type(located),
                  attempt=int(record.get("attempts", 0) or 0))
