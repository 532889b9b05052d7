"""The pull worker: StreamingPull into batches, each processed as push would, then acked or nacked.

``create_worker(router, settings, ...)`` builds one from the router and the
settings alone (``eventbus.assembly``, the same parts as ``create_app``; no
Flask), and ``eventbus worker`` runs it on a subscription.

**Subscriber.** google-cloud-pubsub's ``SubscriberClient.subscribe``
(StreamingPull) with ``FlowControl(max_messages, max_bytes)``: the library
keeps a stream open, extends the ack deadline of every message it holds (so a
long batch never hits the ack deadline), and calls back per message; the
callback only queues it (``Inbox``). StreamingPull was chosen over unary pull
because the library's lease management, flow control and exactly-once
acknowledgements come with it, and a batch is formed from the queue anyway.

**Loop.** Take up to ``batch_size`` messages (waiting at most ``batch_wait``
for the batch to fill once one has arrived), wait for the rate limit, run the
batch (``Processor.run``: one claim and one finish for the batch), then ack
what push would answer 2xx
(processed, duplicate, rejected, conflict) and nack the rest (retry,
unavailable, lease lost, in progress): Pub/Sub redelivers with its backoff,
and the store's redrive is the backstop, exactly as for push.

**Ordering keys.** Messages are answered in the order they were pulled, so
a later message of an ordering key is never acked before an earlier one; once
one message of a key is nacked, the rest of that key in the batch are nacked
too, so Pub/Sub redelivers them in order (what they did is stored: their
redelivery is a duplicate).

**Exactly-once.** On a subscription with exactly-once delivery, acks go
through ``ack_with_response``; a failed ack is logged and counted, never
retried by hand (the record already protects the effect: a redelivery is a
duplicate).

**Async handlers.** A route's ``async def`` handler runs on the processor's
event loop (``eventbus.processor.handler_loop``): a batch's async handlers
await side by side (up to ``EVENTBUS_ASYNC_CONCURRENCY`` in the process),
its sync handlers run on ``--concurrency`` threads as before.

**Shutdown.** ``stop()`` (SIGTERM) stops pulling, finishes the batch in
flight, acks or nacks it, nacks what is queued but not started, and returns.
Async handlers still awaiting ``EVENTBUS_ASYNC_STOP_GRACE_SECONDS`` after
``stop()`` are cancelled: their events are given back (nacked, the attempt not
spent) and come back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from eventbus.assembly import assemble
from eventbus.correlation import logs
from eventbus.model.delivery import Delivery
from eventbus.model.errors import Classifier, StoreUnavailable
from eventbus.model.router import Router
from eventbus.processor import Clock, Processor, Result
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from eventbus.telemetry import Telemetry
from eventbus.telemetry import from_settings as telemetry_from_settings
from eventbus.workers.metrics import WorkerMetrics
from eventbus.workers.rate import RateLimit

logger = logging.getLogger("eventbus.worker")
request_log = logging.getLogger("eventbus.request")


class PulledMessage(Protocol):
    """What the worker needs of a pulled message (google-cloud-pubsub's ``Message``)."""

    data: bytes
    attributes: Any
    message_id: str
    ordering_key: str
    delivery_attempt: int | None

    def ack(self) -> None:
        """Acknowledge."""

    def nack(self) -> None:
        """Ask for redelivery."""

    def ack_with_response(self) -> Any:
        """Acknowledge on an exactly-once subscription; a future of the result."""


class Inbox:
    """The queue between the subscriber's callback threads and the batch loop."""

    def __init__(self) -> None:
        self._queue: queue.Queue[PulledMessage] = queue.Queue()

    def put(self, message: PulledMessage) -> None:
        """The subscriber's callback: queue the message, never block."""
        self._queue.put(message)

    def take(self, size: int, wait: float, stop: threading.Event,
             monotonic: Callable[[], float] = time.monotonic) -> list[PulledMessage]:
        """Up to ``size`` messages: block for the first (until ``stop``), then ``wait`` more."""
        first = self._first(stop)
        if first is None:
            return []
        batch, deadline = [first], monotonic() + wait
        while len(batch) < size:
            remaining = deadline - monotonic()
            try:
                batch.append(self._queue.get(timeout=max(remaining, 0)) if remaining > 0
                             else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _first(self, stop: threading.Event) -> PulledMessage | None:
        while not stop.is_set():
            try:
                return self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def drain(self) -> list[PulledMessage]:
        """Everything queued now (at shutdown: nacked, never started)."""
        left = []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                return left


@dataclass
class Counters:
    """What the worker did, for logs, telemetry and tests."""

    batches: int = 0
    acked: int = 0
    nacked: int = 0
    failed_acks: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class PullWorker:
    """Runs batches from an ``Inbox`` until ``stop()``; see the module docstring."""

    def __init__(self, processor: Processor, inbox: Inbox, *, subscription: str,
                 batch_size: int = 100, batch_wait: float = 0.05,
                 rate: RateLimit | None = None, exactly_once: bool = False,
                 metrics: WorkerMetrics | None = None) -> None:
        self.processor, self.inbox, self.subscription = processor, inbox, subscription
        self.metrics = metrics or WorkerMetrics(None)
        self.batch_size, self.batch_wait = batch_size, batch_wait
        self.rate = rate or RateLimit(None)
        self.exactly_once = exactly_once
        self.stopping = threading.Event()
        self.counters = Counters()

    def stop(self) -> None:
        """Stop taking batches; the one in flight is finished and answered (its async
        handlers cancelled after the grace period, their events given back)."""
        self.stopping.set()
        self.processor.stop()

    def run(self) -> Counters:
        """Process batches until ``stop()``; then nack what is queued but not started."""
        while not self.stopping.is_set():
            batch = self.inbox.take(self.batch_size, self.batch_wait, self.stopping)
            if batch:
                self.run_batch(batch)
        for message in self.inbox.drain():
            message.nack()
            self.counters.nacked += 1
        return self.counters

    def run_batch(self, batch: Sequence[PulledMessage]) -> list[Result]:
        """Process one batch and answer each message."""
        self.rate.wait(len(batch))
        started = time.perf_counter()
        results = self.processor.run([self.delivery(m) for m in batch])
        stopped: set[str] = set()  # ordering keys with a message nacked in this batch
        for message, result in zip(batch, results, strict=True):
            keep_order = bool(message.ordering_key) and message.ordering_key in stopped
            self._answer(message, result, time.perf_counter() - started, nack=keep_order)
            if message.ordering_key and not result.outcome.acked:
                stopped.add(message.ordering_key)
        self.counters.batches += 1
        stats = self.metrics.last
        logger.debug("batch of %d: claim %.1f ms, finish %.1f ms", len(batch),
                     stats.claim_seconds * 1000, stats.finish_seconds * 1000)
        return results

    def delivery(self, message: PulledMessage) -> Delivery:
        """The message as the processor takes it (the same ``Delivery`` push builds)."""
        published = getattr(message, "publish_time", None)
        return Delivery(bytes(message.data), dict(message.attributes or {}),
                        message_id=str(message.message_id),
                        publish_time=published.isoformat() if published else "",
                        subscription=self.subscription,
                        delivery_attempt=message.delivery_attempt,
                        ordering_key=message.ordering_key or "", form="pull")

    def _answer(self, message: PulledMessage, result: Result, seconds: float,
                nack: bool = False) -> None:
        outcome = result.outcome.value
        self.counters.outcomes[outcome] = self.counters.outcomes.get(outcome, 0) + 1
        if result.outcome.acked and not nack:
            self._ack(message, result)
        else:
            message.nack()
            self.counters.nacked += 1
        _request_line(message, result, self.subscription, seconds,
                      acked=result.outcome.acked and not nack)

    def _ack(self, message: PulledMessage, result: Result) -> None:
        self.counters.acked += 1
        if not self.exactly_once:
            message.ack()
            return
        try:
            message.ack_with_response().result()
        except Exception as exc:  # AcknowledgeError: the record protects the effect
            self.counters.failed_acks += 1
            self.metrics.failed_ack()
            logger.warning("ack of %s failed: %s (a redelivery will be a duplicate)",
                           message.message_id, exc)


def create_worker(router: Router, settings: Settings | None = None,
                  store: EventStore | None = None, *, subscription: str = "",
                  now: Clock | None = None, publisher: MessagePublisher | None = None,
                  classifier: Classifier | None = None, telemetry: Telemetry | None = None,
                  batch_size: int = 100, batch_wait: float = 0.05, concurrency: int = 1,
                  rate: RateLimit | None = None, exactly_once: bool = False) -> PullWorker:
    """Return a pull worker for ``router``: the parts ``create_app`` has, without Flask.

    ``subscription`` is the path acks are logged against; ``eventbus worker``
    opens it and feeds ``worker.inbox``. Missing parts come from ``settings``
    (default ``Settings.from_env()``), as for the push app.
    """
    settings = settings or Settings.from_env()
    logs.configure(settings.service, settings.log_level, project=settings.project_id)
    telemetry = telemetry or telemetry_from_settings(settings, now=now)
    metrics = WorkerMetrics(getattr(telemetry, "meter", None))
    parts = assemble(router, settings, store, now=now, publisher=publisher,
                     classifier=classifier, telemetry=telemetry, concurrency=concurrency,
                     middleware=[metrics])
    try:  # as the app does: the batch claim relies on the key's unique index
        parts.processor.ensure_indexes()
    except StoreUnavailable as exc:
        logger.warning("indexes not ensured yet: %s", exc)
    return PullWorker(parts.processor, Inbox(), subscription=subscription,
                      batch_size=batch_size, batch_wait=batch_wait, rate=rate,
                      exactly_once=exactly_once, metrics=metrics)


def _request_line(message: PulledMessage, result: Result, subscription: str,
                  seconds: float, *, acked: bool) -> None:
    """The push path's ``REQUEST_INBOUND`` line, for a pulled message (``method`` PULL)."""
    # The outcome's own status and level (``FACTS``), unless the batch nacks an acked
    # outcome (a later message of a nacked ordering key): a nack, a warning.
    facts = result.outcome.facts
    status, level = (facts.status, facts.level) if acked else (503, logging.WARNING)
    request_log.log(level, "PULL %s %s", subscription, result.outcome.value, extra={
        "logType": "REQUEST_INBOUND", "method": "PULL", "path": subscription,
        "status": status, "outcome": result.outcome.value, "idempotency_key": result.key,
        "event_type": result.event_type, "attempt": result.attempt,
        "messageId": message.message_id, "duration": round(seconds * 1000, 1)})
