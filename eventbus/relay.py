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
  ``Settings.relay_budget_seconds`` (plus the store write of the entry it is
  on); whatever is left is left ``PENDING`` for the sweeper. It never raises.
* **as a sweeper**, ``python -m eventbus relay [--once]``: finds documents
  whose outbox has an entry ``PENDING`` for longer than a grace period (the
  ``outbox.status`` index) and publishes it. This is what recovers a crash
  between the commit and the publish.

Publishing is at least once: a publish whose answer was lost, or two relays
on the same entry, publish a child twice. That is harmless, because the
child's key is stable and the receiver's claim deduplicates it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo.collection import Collection

from eventbus import records
from eventbus.context import PENDING, PUBLISHED
from eventbus.errors import EventBusError, PublishError
from eventbus.event import Event, parse_event
from eventbus.keys import CASCADE_LINKS, canonical_json
from eventbus.publisher import EventPublisher

logger = logging.getLogger("eventbus.relay")

OUTBOX_INDEX = "outbox.status_1"
"""The sweep's index, one of ``eventbus.store.INDEXES``."""
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
    """Publishes pending outbox entries of the ``partner_events`` collection.

    Time is injected: ``now`` stamps ``published_at``, ``monotonic`` measures
    the budget, ``sleep`` and ``jitter`` drive the backoff, so tests run
    without waiting.
    """

    def __init__(self, collection: Collection, publisher: EventPublisher, *,
                 now: Callable[[], datetime], budget: float | None = None,
                 backoff: Backoff = Backoff(), sleep: Callable[[float], None] = time.sleep,
                 jitter: Callable[[], float] = random.random,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.collection, self.publisher, self.now = collection, publisher, now
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

    def relay(self, parent_key: str, outbox: Sequence[Mapping[str, Any]],
              budget: float | None = None) -> RelayReport:
        """Publish the PENDING entries of one parent's outbox, within ``budget`` seconds."""
        deadline = None if budget is None else self._monotonic() + budget
        report = RelayReport()
        for index, entry in enumerate(outbox):
            if entry.get("status") != PENDING:
                continue
            if deadline is not None and self._monotonic() >= deadline:
                report.deferred += 1
                continue
            report.add(self._relay_entry(parent_key, index, entry, deadline))
        return report

    def sweep(self, grace: timedelta) -> RelayReport:
        """Relay every outbox entry PENDING for longer than ``grace``; one pass."""
        report = RelayReport()
        for document in self.pending(grace):
            report.add(self.relay(document["idempotency_key"], document["outbox"]))
        return report

    def pending(self, grace: timedelta) -> Iterator[dict[str, Any]]:
        """Yield the documents with an outbox entry PENDING since ``now - grace`` or before."""
        cutoff = records.bson_time(self.now() - grace)
        cursor = self.collection.find(pending_filter(cutoff), {"idempotency_key": 1, "outbox": 1})
        # Pinned: without the index the sweep would scan every stored event.
        yield from cursor.hint(OUTBOX_INDEX)

    def _relay_entry(self, parent_key: str, index: int, entry: Mapping[str, Any],
                     deadline: float | None) -> RelayReport:
        key = str(entry.get("idempotency_key"))
        attempt = self._publish(entry, deadline)
        if attempt.error is not None:
            logger.warning("child %s of %s not published after %d tries: %s",
                           key, parent_key, attempt.tries, attempt.error)
            self.collection.update_one(entry_filter(parent_key, index, key),
                                       failed_update(index, self.now(), attempt.error,
                                                     attempt.tries))
            return RelayReport(failed=1)
        marked = self.collection.update_one(
            entry_filter(parent_key, index, key),
            published_update(index, self.now(), attempt.message_id, attempt.tries))
        if marked.matched_count == 0:
            logger.info("child %s of %s was already marked published", key, parent_key)
        return RelayReport(published=1)

    def _publish(self, entry: Mapping[str, Any], deadline: float | None) -> _Attempt:
        """Publish one entry, retrying with backoff while tries and budget last."""
        retry = 0
        while True:
            try:
                return _Attempt(message_id=self._publish_once(entry, deadline),
                                tries=retry + 1)
            except PublishError as exc:
                retry += 1
                if not self._wait_for_retry(retry, deadline):
                    return _Attempt(tries=retry, error=exc)
            except EventBusError as exc:  # a corrupted entry: no retry can succeed
                return _Attempt(tries=retry, error=exc)

    def _publish_once(self, entry: Mapping[str, Any], deadline: float | None) -> str:
        links = {name: str(entry[name]) for name in CASCADE_LINKS if entry.get(name)}
        return self.publisher.publish_event(
            outbox_event(entry), key=str(entry["idempotency_key"]),
            ordering_key=entry.get("ordering_key") or None, attributes=links,
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


def outbox_event(entry: Mapping[str, Any]) -> Event:
    """Return the event of an outbox entry, validated as the receiver will."""
    return parse_event(canonical_json({name: entry.get(name) for name in _EVENT_FIELDS}).encode())


def pending_filter(cutoff: datetime) -> dict[str, Any]:
    """Return the filter of documents with an entry PENDING since ``cutoff`` or before.

    The plain ``outbox.status`` term lets the server use its index; the
    ``$elemMatch`` makes both conditions hold for the same entry.
    """
    return {"outbox.status": PENDING,
            "outbox": {"$elemMatch": {"status": PENDING, "created_at": {"$lte": cutoff}}}}


def entry_filter(parent_key: str, index: int, child_key: str) -> dict[str, Any]:
    """Return the filter that matches entry ``index`` only while it is still PENDING.

    The outbox is written once with SUCCESS and never reordered, so an index
    names one entry for good; the key check guards against a rewritten document.
    """
    return {"idempotency_key": parent_key, f"outbox.{index}.idempotency_key": child_key,
            f"outbox.{index}.status": PENDING}


def published_update(index: int, now: datetime, message_id: str, tries: int) -> dict[str, Any]:
    """Return the update that marks entry ``index`` PUBLISHED."""
    entry = f"outbox.{index}"
    return {"$set": {f"{entry}.status": PUBLISHED, f"{entry}.published_at": records.bson_time(now),
                     f"{entry}.messageId": message_id},
            "$inc": {f"{entry}.publish_attempts": tries},
            "$unset": {f"{entry}.last_error": ""}}


def failed_update(index: int, now: datetime, exc: BaseException, tries: int) -> dict[str, Any]:
    """Return the update that records failed tries on entry ``index``, which stays PENDING."""
    entry = f"outbox.{index}"
    return {"$set": {f"{entry}.last_error": records.error_document(exc, "transient"),
                     f"{entry}.last_attempt_at": records.bson_time(now)},
            "$inc": {f"{entry}.publish_attempts": tries}}
