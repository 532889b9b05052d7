"""A batch of deliveries through the push path's own processor, with batched store round trips.

The pull worker must decide every message exactly as push does (the same
intake, claim rules, handlers, classification, attempt cap, telemetry), so it
runs ``Processor.process`` per message, unchanged, over a ``BatchStore``:

1. every delivery is located once (``Intake.locate``); deliveries of one key
   in the batch collapse to the first (the others follow its outcome);
2. one ``claim_many`` claims every key; ``BatchStore.claim`` then answers each
   message's claim from that result (taken, duplicate, conflict, held);
3. the handlers run (``concurrency`` threads); a ``succeed`` or ``fail`` is
   held back, and one ``finish_many`` stores them all; a key whose lease was
   lost meanwhile becomes ``lease_lost`` (nacked, as push answers 503);
4. only then, for each SUCCESS with children, the service's ``after_success``
   (the inline relay) runs: a child is never published before its parent is
   stored SUCCESS.

While the batch runs, ``BatchHeartbeat`` renews every lease of the batch in
one round trip per beat. A store that cannot be reached at claim or finish
fails the whole batch transiently (every message nacked; leases expire and
redelivery or the redrive sweeper finishes the events).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import AlreadyExists, Conflict, ContentRejected, StoreUnavailable
from eventbus.model.outcome import Outcome
from eventbus.processor import Located, Processor, Result
from eventbus.processor.heartbeat import Heartbeat
from eventbus.store import documents
from eventbus.store.base import BatchClaim, Claim, EventStore, Finish

logger = logging.getLogger("eventbus.worker")


class BatchStore:
    """The store as one batch's processor sees it: claims answered, finishes held back."""

    def __init__(self, store: EventStore, claimed: BatchClaim,
                 fingerprints: Mapping[str, str]) -> None:
        self._store, self._claimed, self._fingerprints = store, claimed, fingerprints
        self._lock = threading.Lock()
        self.finishes: dict[str, Finish] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)  # get, reject, guard_*, database, lease, ...

    def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
        """This batch's claim on ``key``, or the exception ``claim`` would raise."""
        if key in self._claimed.taken:
            return self._claimed.taken[key]
        if key in self._claimed.refused:
            raise ContentRejected(f"claim {key!r}: the store refused the content")
        record = self._claimed.records.get(key)
        if record is None:
            return self._store.claim(key, fields, now)
        if documents.conflicts(record, self._fingerprints.get(key, "")):
            raise Conflict(record)
        raise AlreadyExists(record)

    def succeed(self, key: str, owner: str, now: datetime,
                outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Hold back SUCCESS with ``outbox``; ``finish_many`` stores it."""
        return self._hold(Finish(key, owner, outbox=tuple(outbox)))

    def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
             retryable: bool, redrive_at: datetime | None = None) -> bool:
        """Hold back FAILED with ``error``; ``finish_many`` stores it."""
        return self._hold(Finish(key, owner, error=dict(error), retryable=retryable,
                                 redrive_at=redrive_at))

    def _hold(self, finish: Finish) -> bool:
        with self._lock:
            self.finishes[finish.key] = finish
        return True


class BatchHeartbeat(Heartbeat):
    """Renews every live lease of the worker in one round trip per beat (``renew_many``)."""

    def beat(self) -> None:
        """Renew all live leases at once; mark the ones another worker took as lost."""
        with self._lock:
            leases = [lease for lease in self._live.values() if not lease.lost]
        if not leases:
            return
        try:
            held = self.store.renew_many({lease.key: lease.owner for lease in leases},  # type: ignore[attr-defined]
                                         self.now())
        except StoreUnavailable as exc:  # the next beat tries again
            logger.warning("batch leases not renewed: %s", exc)
            return
        for lease in leases:
            lease.lost = lease.key not in held

    @contextlib.contextmanager
    def hold(self, owners: Mapping[str, str]) -> Iterator[None]:
        """Keep every lease of a batch alive from its claim to its finish."""
        with contextlib.ExitStack() as stack:
            for key, owner in owners.items():
                stack.enter_context(self.keep(key, owner))
            yield


class _Located:
    """An intake that answers with the deliveries the batch already located."""

    def __init__(self, located: Mapping[int, Located]) -> None:
        self._located = located

    def locate(self, delivery: Delivery) -> Located:
        return self._located[id(delivery)]


@dataclasses.dataclass
class BatchStats:
    """One batch's figures, for telemetry and the bench."""

    size: int = 0
    claim_seconds: float = 0.0
    finish_seconds: float = 0.0
    lost: int = 0


class BatchRunner:
    """Runs batches through a copy of ``processor`` whose store is a ``BatchStore``."""

    def __init__(self, processor: Processor, *, concurrency: int = 1,
                 heartbeat: BatchHeartbeat | None = None) -> None:
        self.processor, self.concurrency = processor, max(1, concurrency)
        self.store = processor.store
        self.heartbeat = heartbeat or BatchHeartbeat(self.store, now=processor.now)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="eventbus-batch")
        self.last = BatchStats()

    def close(self) -> None:
        """Stop the handler threads (after the batch in flight)."""
        self._pool.shutdown(wait=True)

    def run(self, deliveries: Sequence[Delivery]) -> list[Result]:
        """Process ``deliveries``; one ``Result`` each, in order. Never raises for a message."""
        located = {id(d): self.processor.locate(d) for d in deliveries}
        first: dict[str, Delivery] = {}
        for delivery in deliveries:
            found = located[id(delivery)]
            if found.error is None:
                first.setdefault(found.key, delivery)
        self.last = BatchStats(size=len(deliveries))
        try:
            claimed = self._claim(first, located)
        except StoreUnavailable as exc:
            logger.warning("batch of %d not claimed: %s", len(deliveries), exc)
            return [Result(Outcome.UNAVAILABLE, error=type(exc).__name__) for _ in deliveries]
        return self._run_claimed(deliveries, located, first, claimed)

    def _claim(self, first: Mapping[str, Delivery], located: Mapping[int, Located]) -> BatchClaim:
        started = time.perf_counter()
        items = {key: located[id(delivery)].fields for key, delivery in first.items()}
        claimed = self.store.claim_many(items, self.processor.now()) if items else \
            BatchClaim({}, {})
        self.last.claim_seconds = time.perf_counter() - started
        return claimed

    def _run_claimed(self, deliveries: Sequence[Delivery], located: Mapping[int, Located],
                     first: Mapping[str, Delivery], claimed: BatchClaim) -> list[Result]:
        view = BatchStore(self.store, claimed,
                          {key: located[id(d)].fingerprint for key, d in first.items()})
        processor = self._processor(view, located)
        unique = [d for d in deliveries if located[id(d)].error is not None
                  or first.get(located[id(d)].key) is d]
        owners = {key: claim.owner for key, claim in claimed.taken.items()}
        with self.heartbeat.hold(owners):
            results = dict(zip(map(id, unique), self._pool.map(processor.process, unique),
                               strict=True))
            lost = self._finish(view)
        return self._outcomes(deliveries, located, first, results, lost, view)

    def _processor(self, view: BatchStore, located: Mapping[int, Located]) -> Processor:
        # A shallow copy, not a new Processor: the router was checked and the
        # guard built once, when the app was; each batch swaps only its parts.
        processor = copy.copy(self.processor)
        processor.store, processor.heartbeat = view, self.heartbeat
        processor.after_success = None  # the runner relays once the batch is finished
        processor.intake = _Located(located)  # type: ignore[assignment]
        return processor

    def _finish(self, view: BatchStore) -> set[str] | None:
        """Store the held-back outcomes; the lost keys, or None when the store is down."""
        started = time.perf_counter()
        try:
            lost = self.store.finish_many(list(view.finishes.values()), self.processor.now())
        except StoreUnavailable as exc:
            logger.warning("batch outcomes not stored: %s", exc)
            return None
        finally:
            self.last.finish_seconds = time.perf_counter() - started
        self.last.lost = len(lost)
        return lost

    def _outcomes(self, deliveries: Sequence[Delivery], located: Mapping[int, Located],
                  first: Mapping[str, Delivery], results: Mapping[int, Result],
                  lost: set[str] | None, view: BatchStore) -> list[Result]:
        out = []
        for delivery in deliveries:
            key = located[id(delivery)].key
            leader = first.get(key) if located[id(delivery)].error is None else None
            result = results[id(leader if leader is not None else delivery)]
            result = _settled(result, key, lost, view)
            if leader is not None and leader is not delivery and result.outcome.acked:
                result = dataclasses.replace(result, outcome=Outcome.DUPLICATE)
            out.append(result)
        self._relay(view, lost)
        return out

    def _relay(self, view: BatchStore, lost: set[str] | None) -> None:
        hook: Callable[[str, Sequence[Mapping[str, Any]]], None] | None = \
            self.processor.after_success
        if hook is None or lost is None:
            return
        for key, finish in view.finishes.items():
            if finish.error is None and finish.outbox and key not in lost:
                try:
                    hook(key, finish.outbox)
                except Exception:  # stored SUCCESS: the sweeper publishes what is left
                    logger.exception("relay after the batch failed for %s", key)


def _settled(result: Result, key: str, lost: set[str] | None, view: BatchStore) -> Result:
    """The result once the batch's outcomes are stored (or not)."""
    if key not in view.finishes:
        return result  # nothing held back: a duplicate, a rejection, a conflict
    if lost is None:
        return dataclasses.replace(result, outcome=Outcome.UNAVAILABLE, error="StoreUnavailable")
    if key in lost:
        return dataclasses.replace(result, outcome=Outcome.LEASE_LOST, error="LeaseLost")
    return result
