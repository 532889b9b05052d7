"""The outbox relay: publish the children a handler emitted, then mark them published.

A handler's children are written into the parent's document by the same
update that marks it SUCCESS (``outbox``, each entry ``PENDING``). The relay
publishes each pending entry with the standard attributes (``event_type``,
``event_version``, ``idempotency_key`` = the child key, ``parent_key``,
``root_key``, and the ordering key if any), then marks it ``PUBLISHED`` with
``published_at`` and ``messageId`` in one conditional update.

It runs in two places:

* **inline**, as the processor's ``after_success`` hook, right after SUCCESS
  is stored and before the push is acked. It spends at most
  ``Settings.relay_budget_seconds`` per parent (plus the store write of the
  entry it is on); whatever is left is left ``PENDING`` for the sweeper. It
  never raises. For a batch of parents (the pull worker's), ``relay_many``
  relays up to ``parallel`` parents at once (``Settings.relay_parallel``):
  each publish waits for Pub/Sub's answer, and one parent after another a
  batch of 100 spent seconds waiting. Parents whose children share an
  ordering key stay one after another, in the batch's order.
* **as a sweeper**, ``eventbus relay [--once]``: asks the store for entries
  ``PENDING`` for longer than a grace period and publishes them. This is
  what recovers a crash between the commit and the publish.

Publishing is at least once: a publish whose answer was lost, or two relays
on the same entry, publish a child twice. That is harmless, because the
child's key is stable and the receiver's claim deduplicates it.

An entry may also **forward** its event to a public topic
(``eventbus.model.forward``): the relay publishes its contract body to that
topic with ``idempotency_key`` = the source event's key, ``contract``,
``contract_version`` and ``forward_id`` attributes, and marks it the same way.

A child was validated once, when the handler emitted it; the relay
serialises the stored entry into the message without parsing it again.
Each entry also carries the trace context it was emitted in; the relay
passes it on in the child's ``traceparent`` attribute (with tracing on, the
context of its own ``publish`` span), so a cascade is one trace even when
the sweeper publishes a child long after.

May import: ``eventbus.model``, ``eventbus.store.base``, the pure builders of
``eventbus.store.documents``, ``eventbus.pubsub.message`` and ``eventbus.telemetry``; it reads and
writes the outbox only through the store.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import random
import time
import types
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from eventbus.correlation import tracecontext
from eventbus.model.errors import EventBusError, InvalidEvent, PublishError
from eventbus.model.forward import is_forward
from eventbus.model.keys import CASCADE_LINKS, canonical_json
from eventbus.model.status import Status
from eventbus.pubsub.message import MessagePublisher, message_attributes
from eventbus.store.base import OutboxEntry, OutboxStore
from eventbus.store.documents import error_document
from eventbus.telemetry import Telemetry

logger = logging.getLogger("eventbus.outbox.relay")
_CARRY_NOTHING: contextlib.nullcontext[Mapping[str, str]] = contextlib.nullcontext(
    types.MappingProxyType({}))

_EVENT_FIELDS = ("event_type", "event_version", "event_direction", "entity_metadata",
                 "entity_data")


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Retry timing: the first retry at once, then exponential with full jitter.

    Retry ``n`` (1-based) waits 0 for ``n == 1``, else a random share of
    ``min(cap, base * 2 ** (n - 2))``, so that relays retrying together spread out.
    """

    tries: int = 4
    base: float = 0.1
    cap: float = 2.0

    def delay(self, retry: int, jitter: float) -> float:
        """Return the wait before retry ``retry``; ``jitter`` is uniform in [0, 1)."""
        if retry <= 1:
            return 0.0
        return jitter * min(self.cap, self.base * 2 ** (retry - 2))


@dataclasses.dataclass
class RelayReport:
    """What one relay run did, counted in outbox entries."""

    published: int = 0
    failed: int = 0
    """Publishing failed after every try; the entry stays PENDING for the sweeper."""
    deferred: int = 0
    """Not tried because the inline budget ran out; left PENDING for the sweeper."""

    def add(self, other: RelayReport) -> None:
        """Add ``other``'s counts to this report."""
        self.published += other.published
        self.failed += other.failed
        self.deferred += other.deferred

    def __str__(self) -> str:
        return (f"published {self.published}, failed {self.failed}, "
                f"deferred {self.deferred}")


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """How publishing one entry ended: a message id, or the last error."""

    tries: int
    message_id: str = ""
    error: EventBusError | None = None


class Relay:
    """Publishes pending outbox entries through the store's outbox primitives.

    Time is injected: ``now`` stamps ``published_at``, ``monotonic`` measures
    the budget, ``sleep`` and ``jitter`` drive the backoff, so tests run
    without waiting. So is ``telemetry``: one ``publish`` span per entry,
    whose context the child carries (default: the stored emitting context only).
    ``parallel`` is how many parents ``relay_many`` relays at once (1: in turn).
    """

    def __init__(self, store: OutboxStore, publisher: MessagePublisher, *,
                 now: Callable[[], datetime], budget: float | None = None,
                 backoff: Backoff = Backoff(), sleep: Callable[[float], None] = time.sleep,
                 jitter: Callable[[], float] = random.random,
                 monotonic: Callable[[], float] = time.monotonic,
                 telemetry: Telemetry | None = None, parallel: int = 1) -> None:
        self.store, self.publisher, self.now = store, publisher, now
        self.parallel = max(1, parallel)
        self._pool: ThreadPoolExecutor | None = None
        # Only tracing has work to do per child: without it, nothing of telemetry runs here.
        self.telemetry = telemetry if telemetry is not None and telemetry.tracing else None
        self.budget, self.backoff = budget, backoff
        self._sleep, self._jitter, self._monotonic = sleep, jitter, monotonic

    def __call__(self, parent_key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
        """The ``after_success`` hook: relay within the budget; log, never raise."""
        try:
            report = self.relay(parent_key, outbox, budget=self.budget)
        except Exception:  # a relay failure must never fail a processed message
            logger.exception("inline relay of %s failed; left to the sweeper", parent_key)
            return
        if report.failed or report.deferred:
            logger.warning("inline relay of %s: %s; the rest is left to the sweeper",
                           parent_key, report)

    def relay_many(self, outboxes: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> None:
        """The ``after_success`` hook for a batch: each ``(parent_key, outbox)`` as ``__call__``.

        Up to ``parallel`` parents at once, each within its own budget; parents
        whose pending children share an ordering key one after another, in the
        given order, so a key's messages are published in the order they were
        emitted. Logs, never raises.
        """
        chains = ordered_chains(outboxes)
        if self.parallel == 1 or len(chains) == 1:
            self._chain(outboxes)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="eventbus-relay")
        # Each chain in a copy of the caller's context: its log lines keep the batch's
        # request id, and a context is entered by one thread at a time.
        futures = [self._pool.submit(contextvars.copy_context().run, self._chain, chain)
                   for chain in chains]
        for future in futures:
            future.result()

    def _chain(self, outboxes: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> None:
        for parent_key, outbox in outboxes:
            self(parent_key, outbox)

    def close(self) -> None:
        """Stop ``relay_many``'s threads (idle between batches)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def relay(self, parent_key: str, outbox: Sequence[Mapping[str, Any]],
              budget: float | None = None) -> RelayReport:
        """Publish the PENDING entries of one parent's outbox, within ``budget`` seconds."""
        entries = [OutboxEntry(parent_key, index, entry) for index, entry in enumerate(outbox)
                   if entry.get("status") == Status.PENDING]
        return self.relay_entries(entries, budget)

    def relay_entries(self, entries: Sequence[OutboxEntry],
                      budget: float | None = None) -> RelayReport:
        """Publish ``entries``, within ``budget`` seconds; the rest are deferred."""
        deadline = None if budget is None else self._monotonic() + budget
        report = RelayReport()
        for entry in entries:
            if deadline is not None and self._monotonic() >= deadline:
                report.deferred += 1
                continue
            report.add(self._relay_entry(entry, deadline))
        return report

    def sweep(self, grace: timedelta) -> RelayReport:
        """Relay every outbox entry PENDING for longer than ``grace``; one pass."""
        return self.relay_entries(list(self.store.pending_outbox(self.now() - grace)))

    def _relay_entry(self, entry: OutboxEntry, deadline: float | None) -> RelayReport:
        # Log lines of the publish belong to the trace the child was emitted in.
        stored = tracecontext.from_attributes(entry.entry)
        with tracecontext.scope(stored or tracecontext.current_trace(),
                                tracecontext.current_request_id()), \
                self._publishing(entry.entry) as carried:
            attempt = self._publish(entry.entry, deadline, carried)
        if attempt.error is not None:
            logger.warning("child %s of %s not published after %d tries: %s",
                           entry.key, entry.parent_key, attempt.tries, attempt.error)
            self.store.mark_publish_failed(entry, self.now(),
                                           error_document(attempt.error, "transient"),
                                           attempt.tries)
            return RelayReport(failed=1)
        if not self.store.mark_published(entry, self.now(), attempt.message_id, attempt.tries):
            logger.info("child %s of %s was already marked published", entry.key,
                        entry.parent_key)
        return RelayReport(published=1)

    def _publishing(self, entry: Mapping[str, Any]
                    ) -> contextlib.AbstractContextManager[Mapping[str, str]]:
        return _CARRY_NOTHING if self.telemetry is None else self.telemetry.publishing(entry)

    def _publish(self, entry: Mapping[str, Any], deadline: float | None,
                 carried: Mapping[str, str]) -> _Attempt:
        """Publish one entry, retrying with backoff while tries and budget last."""
        retry = 0
        while True:
            try:
                return _Attempt(message_id=self._publish_once(entry, deadline, carried),
                                tries=retry + 1)
            except PublishError as exc:
                retry += 1
                if not self._wait_for_retry(retry, deadline):
                    return _Attempt(tries=retry, error=exc)
            except EventBusError as exc:  # a corrupted entry: no retry can succeed
                return _Attempt(tries=retry, error=exc)

    def _publish_once(self, entry: Mapping[str, Any], deadline: float | None,
                      carried: Mapping[str, str]) -> str:
        data, attributes = outbox_message(entry)
        attributes.update(carried)
        if is_forward(entry):  # to its public topic; the default topic is the bus
            return self.publisher.publish_message(data, attributes, topic=str(entry["topic"]),
                                                  timeout=self._remaining(deadline))
        return self.publisher.publish_message(data, attributes,
                                              ordering_key=entry.get("ordering_key") or None,
                                              timeout=self._remaining(deadline))

    def _wait_for_retry(self, retry: int, deadline: float | None) -> bool:
        """Sleep before retry ``retry``; False when no try or no budget is left."""
        if retry >= self.backoff.tries:
            return False
        delay = self.backoff.delay(retry, self._jitter())
        if deadline is not None and self._monotonic() + delay >= deadline:
            return False
        self._sleep(delay)
        return True

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(deadline - self._monotonic(), 0.001)


def ordered_chains(outboxes: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]
                   ) -> list[list[tuple[str, Sequence[Mapping[str, Any]]]]]:
    """Group parents so that those whose pending children share an ordering key are together.

    Each chain keeps the given order, and chains come in the order of their
    first parent; a parent without ordered children is a chain of its own.
    """
    root = list(range(len(outboxes)))  # union-find over the parents' positions
    holder: dict[str, int] = {}  # ordering key -> the first parent with a child of it

    def find(index: int) -> int:
        while root[index] != index:
            index = root[index]
        return index

    for index, (_, outbox) in enumerate(outboxes):
        for entry in outbox:
            key = entry.get("ordering_key")
            if not key or entry.get("status") != Status.PENDING:
                continue
            first = holder.setdefault(str(key), index)
            if first != index:  # the earlier parent's chain leads, whichever joins
                root[find(index)] = find(first)
    chains: dict[int, list[tuple[str, Sequence[Mapping[str, Any]]]]] = {}
    for index, parent in enumerate(outboxes):
        chains.setdefault(find(index), []).append(parent)
    return list(chains.values())


def outbox_message(entry: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """Return the message data and attributes of an outbox entry, serialised once.

    The attributes carry the cascade links and the trace context stored with
    the entry (``traceparent``/``tracestate``), so the child joins its parent's trace.
    Raise ``InvalidEvent`` for an entry that lost the fields every entry gets.
    """
    if is_forward(entry):
        return forward_message(entry)
    try:
        body = {name: entry[name] for name in _EVENT_FIELDS}
        key = str(entry["idempotency_key"])
    except KeyError as exc:
        raise InvalidEvent(f"outbox entry has no {exc}") from None
    links = {name: str(entry[name]) for name in CASCADE_LINKS if entry.get(name)}
    emitted = tracecontext.from_attributes(entry)  # the context the child was emitted in
    if emitted is not None:
        links.update(emitted.attributes())
    text = getattr(entry, "text", "")  # the inline relay's: serialised when emitted
    data = (text or canonical_json(body)).encode()
    return data, message_attributes(body["event_type"], body["event_version"], key, links)


def forward_message(entry: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """Return the data and attributes of a forwarding entry: its contract body, public names.

    Only the contract's names go out: the internal event type and cascade
    links stay on the bus. ``idempotency_key`` is the source event's key (a
    consumer deduplicates on it); ``forward_id`` names this one message.
    """
    try:
        data = canonical_json(entry["body"]).encode()
        attributes = {"idempotency_key": str(entry["source_key"]),
                      "contract": str(entry["contract"]),
                      "contract_version": str(entry["contract_version"]),
                      "forward_id": str(entry["idempotency_key"])}
    except KeyError as exc:
        raise InvalidEvent(f"forwarding entry has no {exc}") from None
    emitted = tracecontext.from_attributes(entry)
    if emitted is not None:
        attributes.update(emitted.attributes())
    return data, attributes
