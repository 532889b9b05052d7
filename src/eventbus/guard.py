"""The side-effect guard: seed 004's "Idempotence For Side Effects", on the store.

A side effect the event store cannot make idempotent (an HTTP call to a
partner, an e-mail) runs through ``Guard.run(key, effect)``:

1. **key check**: the key is SUCCESS → the effect is not run again; its
   stored result is returned (``Guarded.skipped``);
2. **lease lock**: the key is leased to this call; if another worker holds a
   live lease, ``LeaseHeld`` (transient: the event is redelivered later);
3. **the effect** runs and returns a JSON-able result;
4. **the key set permanently**: SUCCESS with the result; if the effect
   raised, FAILED with the error, the lease released, and the error re-raised.

The lease is taken and compared on the store's clock, and renewed with the
handler's (``keep``: the processor's heartbeat) while the effect runs, so a
partner call longer than the lease is not taken over by a duplicate delivery.
This narrows duplicate effects to one case: the worker dies (or is frozen
past its lease, so its renewals stop) after the effect started and before
SUCCESS was stored. Passing the key on to the other side (an
``Idempotency-Key`` header) closes it.

``await Guard.run_async(key, effect)`` is the same for an ``async def``
handler: ``effect`` is an async callable, and the store calls (take, finish)
go to a thread (``asyncio.to_thread``) so they never block the event loop. A
hand-off costs 0.06 to 0.17 ms against a store round trip's 0.8 to 3.4 ms
(measured on the 2-core development machine, 300 ``guard_get`` calls to the
local server with and without the hand-off, beside a running bench), and keeps
one store client for both forms; PyMongo's async client would save the
hand-off only.
A cancelled effect (shutdown) is recorded FAILED and its lease released, as
any other failure.

**A store error on a finish write** (issue 39 fault 4). The effect has
returned and its one SUCCESS write meets ``StoreUnavailable`` (a failover):
dropping the result would let the lease lapse and the redelivery call the
partner again, though nothing died. So the SUCCESS write is retried, with a
short doubling backoff (``retry_first`` seconds, at most ``retry_cap``), up to
``retry_tries`` writes and at most half a lease of this process's time
(``monotonic``; ``sleep`` waits, both injectable), with the lease still kept
(``keep``) all along: within half a lease the key is held, so no other
delivery can take it and repeat the effect. Every retry is the same write:
``guard_finish`` stores a SUCCESS whoever holds the lease now (the store
protocol's fence: the effect happened, so the key is set for good, and a
late holder's FAILED cannot undo it; only the FAILED write is owner-fenced).
A late success after the lease lapsed and another instance took the key is
therefore still stored, and stops a third call.

When the retries run out, the event fails transient (``StoreUnavailable``,
redelivered) and the guard **holds the result in the process** (up to
``held_cap`` keys, oldest dropped first): the next run of that key in this
process does not run the effect; it stores the held result (one write) and
returns it as ``skipped``, or fails transient again while the store is down.
What remains is the guard's one boundary, as for a worker that dies after the
effect: a redelivery to *another* process after the lease lapsed, with the
SUCCESS never stored, runs the effect again (an outage longer than the
retries and the lease, or this process gone). An ``Idempotency-Key`` to the
partner closes it.

A ``StoreUnavailable`` on the **FAILED** write is not retried: that write
only releases the lease early (the next run takes the key at once); unwritten,
the lease lapses by itself within one lease, and the next run after it runs
the effect again, which is right for an effect that failed. The effect's own
error is raised, not the store's, so its classification (a ``PermanentError``
stays permanent) is kept; the store error is logged and added as a note.

``run_async`` makes the SUCCESS write with its retries as **one thread job**
(``asyncio.to_thread``), sleeping in that thread: the event loop is never
blocked, and a shutdown that cancels the handler while the write is retrying
cancels only the wait. The coroutine raises ``CancelledError`` at once (the
shutdown is not held up) and the write goes on in its thread until it is
stored or its bounded retries run out (then the result is held as above).
A loop that closes (``HandlerLoop.close``, ``asyncio.run``) waits for its
executor's threads, so it waits for that write too: a shutdown is held up at
most by the retries' bound (half a lease and the writes' own timeouts).
Cancelling the write itself would lose a result the process holds: the
redelivery would take the key after the lease and call the partner again.

May import: ``eventbus.model``, ``eventbus.store.base`` and the pure builders of
``eventbus.store.documents``; it talks to the store only through
``guard_take`` and ``guard_finish``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.errors import ReplayRefused, StoreUnavailable
from eventbus.model.status import Status
from eventbus.store.base import GuardStore
from eventbus.store.documents import error_document

Effect = Callable[[], Mapping[str, Any] | None]
"""A side effect; what it returns (a mapping, or None for nothing) is stored as its result."""
AsyncEffect = Callable[[], Awaitable[Mapping[str, Any] | None]]
"""An async side effect (``Guard.run_async``): awaited, its result stored as ``Effect``'s."""
logger = logging.getLogger("eventbus.guard")

Keeper = Callable[[str, str], contextlib.AbstractContextManager[Any]]
"""Keeps a guard's lease (key, owner) alive for a block: the processor's heartbeat."""


def _unkept(key: str, owner: str) -> contextlib.AbstractContextManager[Any]:
    """No renewal (a guard used outside a processor): the lease runs its length."""
    return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class Guarded:
    """The outcome of ``Guard.run``: the effect's result, now or from an earlier run."""

    key: str
    result: Mapping[str, Any]
    skipped: bool
    """True when an earlier run already succeeded and the effect was not run now."""


class Guard:
    """Runs side effects at most once per key (see the module docstring)."""

    retry_first = 0.05
    """Seconds before the first retry of a SUCCESS write that met ``StoreUnavailable``."""
    retry_cap = 2.0
    """The longest wait between two retries of a SUCCESS write (the backoff doubles up to it)."""
    retry_tries = 10
    """How many SUCCESS writes at most, the first included, before the result is held."""
    held_cap = 1024
    """How many unstored results this process holds at most (oldest dropped first)."""

    def __init__(self, store: GuardStore, *, lease: timedelta, now: Callable[[], datetime],
                 keep: Keeper | None = None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.lease, self.now = store, lease, now
        self.keep: Keeper = keep or _unkept
        self.sleep, self.monotonic = sleep, monotonic
        # key → (owner, result) of effects that returned while the store was down: the
        # next run of the key here stores the result instead of running the effect again.
        self._held: collections.OrderedDict[str, tuple[str, dict[str, Any]]] = \
            collections.OrderedDict()
        self._held_lock = threading.Lock()  # runs come from a processor's thread pool

    def run(self, key: str, effect: Effect, *,
            classify: Callable[[BaseException], str] = lambda exc: "transient") -> Guarded:
        """Run ``effect`` unless ``key`` already succeeded; see the module docstring.

        ``classify`` names the failure stored on FAILED (``transient`` or ``permanent``).
        """
        if (held := self._held_result(key)) is not None:
            return self._store_held(key, *held)
        owner = uuid.uuid4().hex
        done = self.store.guard_take(key, owner, self.now(), self.lease)
        if done is not None:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        # The finish is inside the keep: the lease is renewed while its write is retried.
        with self.keep(key, owner):
            try:
                result = dict(effect() or {})
            except BaseException as exc:
                # Guarded by the owner: a worker whose lease ran out must not undo
                # the state that the lease's next holder wrote.
                self._release(key, owner, exc, classify(exc))
                raise
            self._store_success(key, owner, result)
        return Guarded(key, result, skipped=False)

    async def run_async(self, key: str, effect: AsyncEffect, *,
                        classify: Callable[[BaseException], str] = lambda exc: "transient",
                        ) -> Guarded:
        """``run`` for an async ``effect``, awaited; the store calls run in a thread."""
        if (held := self._held_result(key)) is not None:
            return await asyncio.to_thread(self._store_held, key, *held)
        owner = uuid.uuid4().hex
        done = await asyncio.to_thread(self.store.guard_take, key, owner, self.now(), self.lease)
        if done is not None:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        with self.keep(key, owner):
            try:
                result = dict(await effect() or {})
            except BaseException as exc:  # CancelledError too: the lease goes back at once
                await asyncio.to_thread(self._release, key, owner, exc, classify(exc))
                raise
            # One thread job for the write and its retries: a cancellation (shutdown)
            # stops this wait, never the write (see the module docstring).
            # Shielded: a job still queued for its thread would be dropped by the
            # cancellation, and the result with it.
            await asyncio.shield(asyncio.ensure_future(
                asyncio.to_thread(self._store_success, key, owner, result)))
        return Guarded(key, result, skipped=False)

    def _store_success(self, key: str, owner: str, result: dict[str, Any]) -> None:
        """Store ``result`` as ``key``'s SUCCESS, retrying ``StoreUnavailable`` (bounded).

        Out of retries, the result is held in the process and the last error raised.
        """
        budget = self.lease.total_seconds() / 2
        started, delay = self.monotonic(), self.retry_first
        for tries in range(1, self.retry_tries + 1):
            try:
                # Unfenced by owner on purpose (the store protocol): a retry that lands
                # after the lease lapsed still sets the key, so no third call follows.
                self.store.guard_finish(key, owner, self.now(), succeeded=True, result=result)
                return
            except StoreUnavailable as exc:
                spent = self.monotonic() - started
                if tries == self.retry_tries or spent + delay > budget:
                    self._hold(key, owner, result)
                    logger.warning("guarded effect %s succeeded but its result is not stored "
                                   "after %d writes (%s); held for this key's next run here",
                                   key, tries, exc)
                    raise
                logger.info("guarded effect %s: SUCCESS write %d failed (%s); again in %gs",
                            key, tries, exc, delay)
            self.sleep(delay)
            delay = min(delay * 2, self.retry_cap)

    def _release(self, key: str, owner: str, exc: BaseException, classification: str) -> None:
        """Store the effect's failure (releasing ``owner``'s lease); a store error is not raised.

        Unwritten, the lease lapses by itself; the effect's own error, which the caller
        raises, keeps its classification (see the module docstring).
        """
        try:
            self.store.guard_finish(key, owner, self.now(), succeeded=False,
                                    result=error_document(exc, classification))
        except StoreUnavailable as lost:
            logger.warning("guarded effect %s failed and its lease is not released (%s); "
                           "it lapses by itself", key, lost)
            exc.add_note(f"the guard's FAILED write for {key!r} met: {lost}")

    def _hold(self, key: str, owner: str, result: dict[str, Any]) -> None:
        """Keep an unstored ``result`` for ``key``'s next run in this process."""
        with self._held_lock:
            self._held[key] = (owner, result)
            self._held.move_to_end(key)
            while len(self._held) > self.held_cap:
                self._held.popitem(last=False)

    def _held_result(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """The (owner, result) held for ``key`` (its effect ran, the SUCCESS is unstored)."""
        with self._held_lock:
            return self._held.get(key)

    def _store_held(self, key: str, owner: str, result: dict[str, Any]) -> Guarded:
        """Store a held result (one write, no effect); ``StoreUnavailable`` while still down."""
        self.store.guard_finish(key, owner, self.now(), succeeded=True, result=result)
        with self._held_lock:
            self._held.pop(key, None)
        return Guarded(key, result, skipped=True)


class ReplayGuard(Guard):
    """The guard of replay mode (``eventbus.model.rebuild_policy``): an effect never runs again.

    A key that succeeded returns the result stored the first time (one read,
    ``guard_get``); a key that never succeeded raises ``ReplayRefused``, unless
    ``new_calls`` (the operator's ``--allow-new-calls``) lets it run as live.
    """

    def __init__(self, store: GuardStore, *, lease: timedelta, now: Callable[[], datetime],
                 keep: Keeper | None = None, new_calls: bool = False,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__(store, lease=lease, now=now, keep=keep, sleep=sleep,
                         monotonic=monotonic)
        self.new_calls = new_calls

    def run(self, key: str, effect: Effect, *,
            classify: Callable[[BaseException], str] = lambda exc: "transient") -> Guarded:
        """Return the stored result of ``key``; refuse (or, allowed, run) one never made."""
        done = self.store.guard_get(key)
        if done is not None and done.get("status") == Status.SUCCESS:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        if not self.new_calls:
            raise ReplayRefused(f"guarded call {key!r} never succeeded before; a rebuild makes "
                                "it only with --allow-new-calls")
        return super().run(key, effect, classify=classify)

    async def run_async(self, key: str, effect: AsyncEffect, *,
                        classify: Callable[[BaseException], str] = lambda exc: "transient",
                        ) -> Guarded:
        """``run`` for an async handler: the read in a thread, a new call only when allowed."""
        done = await asyncio.to_thread(self.store.guard_get, key)
        if done is not None and done.get("status") == Status.SUCCESS:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        if not self.new_calls:
            raise ReplayRefused(f"guarded call {key!r} never succeeded before; a rebuild makes "
                                "it only with --allow-new-calls")
        return await super().run_async(key, effect, classify=classify)
