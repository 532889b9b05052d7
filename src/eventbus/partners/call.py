"""Partners: a breaker and a shared rate each, kept in the store so every instance shares them.

A handler makes an outbound call through its partner::

    context.partner(partner_id).call(lambda: post(...))
    await context.partner(partner_id).call_async(lambda: client.post(...))   # async def


(the HTTP call itself on the library's client, ``eventbus.http.deadline.Client``,
so it ends within its deadline however the app wired its session).

* **Names.** ``Partners.get`` normalises a partner's id once
  (``partner_name``: an unusual one becomes ``sha256:<hex>``), and everything
  after it (the breaker, the bucket, parked events, the operator's views)
  uses that stored name as it is.
* **Breaker.** After ``Settings.breaker_failures`` consecutive transient
  failures the breaker opens for ``breaker_open_seconds``; then one call, the
  probe, goes through (half-open); its success closes the breaker, its failure
  opens it again for twice as long (up to ``breaker_open_cap_seconds``). A
  permanent failure (the partner answered, and refused) counts as an answer.
  An operator may hold a breaker open or close it by hand (``force``).
* **Rate.** ``Settings.partner_rate`` (or the partner's own, ``partner_rates``)
  calls per second, kept as one token bucket per partner in the store, so
  three instances share one quota: ``partner_burst_seconds``' worth of calls
  may go at once, then one per interval. Over any span ``T``, at most
  ``rate * T + burst`` calls go, wherever ``T`` starts (no window boundary to
  straddle). The store decides on its own clock, in one round trip
  (``PartnerStore.rate_take``), so instances whose clocks differ by minutes
  share it exactly. A call over it takes the next token and waits for it when
  that is at most ``partner_rate_wait_seconds`` away.
* **Slow calls.** A call that takes ``breaker_slow_seconds`` or more (timed
  on this process's monotonic clock) is slow: counted on the breaker
  (``slow_calls``), and when slow calls reach ``breaker_slow_share`` of the
  process's latest ``breaker_slow_window`` calls (at least
  ``breaker_slow_min_calls`` of them) the breaker opens as for failures; a
  slow probe reopens it. The call itself succeeded: its event is SUCCESS; the
  next ones are parked. A call still running after ``breaker_slow_seconds``
  counts as slow already: before each call the window is asked with them in it,
  so the breaker opens without waiting for the slow answers (``reason`` says
  how many were still running). Where the window lives, and why: ``eventbus.partners.slow_calls``.
  The breaker keeps why it last opened (``reason``: failures, slow calls,
  a failed or slow probe, with the numbers).
* **Bulkhead.** At most ``partner_concurrency`` (or the partner's own,
  ``partner_concurrencies``) calls of one partner in flight in this process
  (``eventbus.partners.bulkhead``, one per partner, owned by ``Partners``). A call over
  it waits up to ``partner_concurrency_wait_seconds`` for a slot, then raises
  ``BulkheadFull`` and its event is parked for
  ``partner_concurrency_park_seconds``, as a rate-limited one is.
* **Parked.** A call the breaker, the rate or the bulkhead does not let through raises
  ``BreakerOpen``, ``RateLimited`` or ``BulkheadFull`` (``PartnerPaused``) with the time it may
  go through; the processor parks the event until then (stored, acked) and
  the store-driven redrive brings it back (all of them at once when a probe
  closes the breaker: ``ParkedEvents.unpark``). The failure that opens the
  breaker, or fails its probe, raises ``BreakerOpen`` too (from the error), so
  the probing event waits with the others instead of spending its redrives.

State moves by pure functions (``admit``, ``succeeded``, ``failed``,
``slowed``, ``recorded``, ``forced``) over ``BreakerState``, written back by compare-and-swap
(``PartnerStore.breaker_swap``): single-document writes, no transaction.

**Async.** ``call_async`` is ``call`` for an async effect, with the same
breaker and rate decisions (the same pure functions over the same stored
state); its store calls go to a thread (``asyncio.to_thread``) and a wait for a
rate token is ``asyncio.sleep``, so the event loop never blocks on them.

**One clock.** Every time a breaker stores or compares (``opened_at``,
``open_until``, ``probe_until``, the ``until`` of ``BreakerOpen``) is the
store's (``store.now()``: the memory store's clock, MongoDB's server clock),
and every rate decision is the store's too; this process's clock only times
its own waits (``sleep``) and its own calls (``monotonic``: slow or not).

**For an async form.** ``Partner.call`` is four pieces an ``async`` call
reuses as they are: ``slot`` (or ``slot_async``: the same bulkhead),
``begin`` (breaker and rate: store round trips), the effect, and ``finish``
(the outcome stored; raises ``BreakerOpen`` when this call opened it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, TypeVar

from eventbus.clock import Clock, SystemClock
from eventbus.model.errors import (
    BreakerOpen,
    BulkheadFull,
    Classification,
    Classifier,
    RateLimited,
    ReplayRefused,
    RetryAfter,
    caused_by,
)
from eventbus.partners.breaker import (
    CLOSED,
    OPEN,
    BreakerState,
    CallOutcome,
    Decision,
    Policy,
    admit,
    describe_reason,
    opened_for,
    partner_name,
    probe_taken,
    recorded,
    swap,
)
from eventbus.partners.bulkhead import Bulkhead, Full
from eventbus.partners.documents import RateLimit
from eventbus.partners.slow_calls import CallWindow, Tally
from eventbus.partners.store import PartnerStore, store_beside
from eventbus.settings import Settings
from eventbus.store.base import ParkedEvents

logger = logging.getLogger("eventbus.partners")

T = TypeVar("T")
_TRACKED = 1024
"""Partners whose bulkhead and window a process keeps before it forgets idle ones
(partner ids come from messages: a flood of new ids must not grow memory)."""


@dataclasses.dataclass(frozen=True)
class Started:
    """A call let through (``Partner.begin``): the breaker as read, and when it started."""

    seen: BreakerState
    at: float
    """This process's monotonic time when the effect started."""
    token: int | None = None
    """Its entry among this process's running calls (``CallWindow.started``; None: slow
    calls are not counted)."""


class Partner:
    """One partner's bulkhead, breaker and rate; ``call`` runs an outbound call through them.

    Made by ``Partners.get``, which normalises the partner's name once:
    ``name`` is the stored name (``partner_name``'s result), kept as it is, so a
    hashed name is never hashed again.
    """

    def __init__(self, name: str, partners: Partners) -> None:
        self.name, self.partners = name, partners

    def call(self, effect: Callable[[], T]) -> T:
        """Run ``effect`` if the bulkhead, breaker and rate let it; raise ``PartnerPaused`` if not.

        The effect's transient failure counts toward opening the breaker;
        its return (or a permanent failure: the partner answered) closes it;
        a slow one counts toward opening it (``eventbus.partners.slow_calls``).
        """
        self.refuse_in_replay()
        running = self._slow_running()
        if running is not None:
            self._open_for_running(*running)
        with self.slot():
            started = self.begin()
            try:
                result = effect()
            except Exception as exc:
                self.finish(started, exc)
                raise
            except BaseException:
                self.abandon(started)
                raise
            self.finish(started, None)
            return result

    def slot(self) -> contextlib.AbstractContextManager[None]:
        """Hold one of the partner's bulkhead slots; raise ``BulkheadFull`` when none comes free."""
        return self.partners.slot(self.name)

    def slot_async(self) -> contextlib.AbstractAsyncContextManager[None]:
        """``slot`` for a coroutine: the same bulkhead, awaited without blocking the loop."""
        return self.partners.slot_async(self.name)

    def refuse_in_replay(self) -> None:
        """Raise ``ReplayRefused`` in replay mode without new calls (before any slot is taken)."""
        if self.partners.refused:
            # Replay mode: a call outside the guard may have run before; see model.replay.
            raise ReplayRefused(f"partner call to {self.name!r} outside the guard: "
                                f"{self.partners.refused}")

    def begin(self) -> Started:
        """Let a call through the breaker and the rate (raise ``PartnerPaused`` if not); time it."""
        self.refuse_in_replay()
        seen = self._admit()
        self.partners.pace(self.name)
        return self._started(seen)

    def _started(self, seen: BreakerState) -> Started:
        at = self.partners.monotonic()
        token = self.partners.window(self.name).started(at) \
            if self.partners.policy.slow.enabled else None
        return Started(seen, at, token)

    def _slow_running(self) -> tuple[Tally, int] | None:
        """This process's window with its calls already running too long counted as slow
        (``eventbus.partners.slow_calls``), when that opens the breaker; else None.
        No store call."""
        slow = self.partners.policy.slow
        if not slow.enabled:
            return None
        tally, running = self.partners.window(self.name).tally_now(self.partners.monotonic(),
                                                                   slow.seconds)
        return (tally, running) if running and slow.opens(tally) else None

    def _open_for_running(self, tally: Tally, running: int) -> None:
        """Open a closed breaker because calls still running are slow; raise ``BreakerOpen``.

        A breaker already open, half-open or held by hand is left as it is: the
        admission that follows decides (a slow probe reopens it when it ends).
        """
        store, policy = self.partners.store, self.partners.policy
        now = store.now()
        reason = {**policy.slow.reason(tally), "running": running}
        after = swap(store, self.name, lambda state: opened_for(state, now, policy.open_seconds,
                                                             reason)
                     if state.state == CLOSED and state.manual is None else None)
        if after is None:
            return
        self.partners.window(self.name).observe(after.opened_at)
        self._opened(after)
        assert after.open_until is not None
        raise BreakerOpen(self.name, after.open_until, "opened: calls running are slow")

    def abandon(self, started: Started) -> None:
        """Forget a call that neither answered nor failed (interrupted): it runs no more."""
        if started.token is not None:
            self.partners.window(self.name).dropped(started.token)

    def finish(self, started: Started, exc: Exception | None) -> None:
        """Store how the call went; raise ``BreakerOpen`` from ``exc`` when this failure
        opened the breaker."""
        after = self._after(started, exc)
        asked = after is not None and (after.reason or {}).get("cause") == "retry after"
        if exc is not None and after is not None and after.open_until is not None and not asked:
            # This failure opened it (or failed the probe): the event waits
            # for the next probe with the others instead of spending redrives.
            raise BreakerOpen(self.name, after.open_until, "opened by this call") from exc

    async def call_async(self, effect: Callable[[], Awaitable[T]]) -> T:
        """``call`` for an async ``effect`` (awaited): the same bulkhead, breaker and rate rules.

        The bulkhead slot is awaited, the store calls run in a thread and a wait
        for the rate is ``asyncio.sleep``, so nothing here blocks the event loop.
        """
        self.refuse_in_replay()
        running = self._slow_running()
        if running is not None:
            await asyncio.to_thread(self._open_for_running, *running)
        async with self.slot_async():
            seen = await asyncio.to_thread(self._admit)
            await self.partners.pace_async(self.name)
            started = self._started(seen)
            try:
                result = await effect()
            except Exception as exc:
                await asyncio.to_thread(self.finish, started, exc)
                raise
            except BaseException:  # cancelled (a shutdown): nothing to count, nothing runs
                self.abandon(started)
                raise
            cancelled = await _settled(asyncio.to_thread(self.finish, started, None))
        if cancelled:
            # The partner answered: its result goes back to the caller (the guard stores it)
            # and the shutdown's cancellation comes at the caller's next await instead.
            task = asyncio.current_task()
            if task is not None:
                task.cancel()
        return result

    def _admit(self) -> BreakerState:
        store, policy = self.partners.store, self.partners.policy
        now = store.now()
        state = BreakerState.from_document(store.breaker_get(self.name))
        # A breaker that opened since this process last looked: its old calls are forgotten.
        self.partners.window(self.name).observe(state.opened_at)
        decision, probing = admit(state, now, policy)
        if decision.allowed and probing is None:
            return state
        if decision.allowed and probing is not None:
            taken = swap(store, self.name, lambda current: probe_taken(current, now, policy), state)
            if taken is not None:
                logger.info("breaker %s half-open: one probe goes through", self.name)
                return taken
            decision = Decision(False, now + timedelta(seconds=policy.probe_seconds),
                                why="probe taken elsewhere")
        assert decision.until is not None
        raise BreakerOpen(self.name, decision.until, decision.why)

    def _outcome(self, started: Started, exc: Exception | None) -> CallOutcome:
        """The call's outcome: answered or failed, how long it took, this process's window."""
        seconds = max(0.0, self.partners.monotonic() - started.at)
        slow_policy = self.partners.policy.slow
        slow = slow_policy.is_slow(seconds)
        # A token exactly when slow calls are counted (``_started``).
        tally = None if started.token is None \
            else self.partners.window(self.name).ended(started.token, slow)
        answered = exc is None or self.partners.classifier.classify(exc) \
            is Classification.PERMANENT
        return CallOutcome(None if answered else f"{type(exc).__name__}: {exc}", seconds,
                           slow, tally)

    def _after(self, started: Started, exc: Exception | None) -> BreakerState | None:
        """Store how the call went; the state when this call opened the breaker."""
        # The call happened: a store error here must not fail it (the guard
        # would call again), so the breaker's bookkeeping only logs.
        store, policy, seen = self.partners.store, self.partners.policy, started.seen
        outcome = self._outcome(started, exc)
        now = store.now()
        later = caused_by(exc, RetryAfter)
        if later is not None and later.partner_wide:
            outcome = dataclasses.replace(outcome, pause=later.delay(
                now, self.partners.settings.retry_after_max_seconds))
        try:
            after = swap(store, self.name,
                         lambda state: recorded(state, now, policy, outcome), seen)
            if after is not None and after.state == CLOSED and seen.state != CLOSED:
                # It answers again: what waited for it comes back at the next sweep,
                # not at each event's own reopening time.
                logger.info("breaker %s closed", self.name)
                store.unpark(self.name, now)
        except Exception:
            logger.exception("breaker %s: the outcome of a call was not stored", self.name)
            return None
        if after is None or after.state != OPEN or after.opened_at != now:
            return None
        self._opened(after)
        return after

    def _opened(self, after: BreakerState) -> None:
        logger.warning("breaker %s open until %s: %s", self.name, after.open_until,
                       describe_reason(after.reason))


@dataclasses.dataclass
class Local:
    """What this process keeps of one partner: its bulkhead and its window of latest calls."""

    bulkhead: Bulkhead
    window: CallWindow
    users: int = 0
    """Calls holding or waiting for a slot now (an entry in use is never forgotten)."""


class Partners:
    """The partners of one processor: its store, classifier, settings, waits, and per partner
    this process's bulkhead and window of latest calls (``local``)."""

    def __init__(self, store: PartnerStore, settings: Settings, *,
                 now: Callable[[], datetime] | None = None,
                 classifier: Classifier | None = None,
                 sleep: Callable[[float], None] | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        """Decide every breaker and rate time on ``store.now()``, never on ``now``.

        ``now`` is this process's clock, only as the source of its waits and
        of its calls' durations: ``sleep`` defaults to ``now.sleep`` and
        ``monotonic`` to ``now.monotonic`` (a ``FakeClock``'s move it), else
        ``time.sleep`` and ``time.monotonic``.
        """
        self.store, self.settings = store, settings
        self.refused = ""
        """Set in replay mode without new calls: why ``Partner.call`` refuses."""
        self.policy = Policy.from_settings(settings)
        self.classifier = classifier or Classifier()
        whole = now if isinstance(now, Clock) else SystemClock()  # a FakeClock's waits too
        self.sleep = sleep or whole.sleep
        self.monotonic: Callable[[], float] = monotonic or whole.monotonic
        # Keyed by stored name, as every lookup is (``rate`` gets a ``Partner.name``).
        self.rates = {partner_name(name): rate for name, rate in settings.partner_rates}
        self.concurrencies = {partner_name(name): cap
                              for name, cap in settings.partner_concurrencies}
        self._local: dict[str, Local] = {}
        self._lock = threading.Lock()


    @classmethod
    def beside(cls, events: ParkedEvents, settings: Settings, **options: Any) -> Partners:
        """Return the partners over the partners' store beside ``events`` (``store_beside``).

        ``options`` are ``Partners``' own (``now``, ``classifier``, ``sleep``, ``monotonic``).
        """
        return cls(store_beside(events, settings), settings, **options)
    def get(self, name: object) -> Partner:
        """Return partner ``name`` (any text), under its stored name: the one normalisation."""
        return Partner(partner_name(name), self)

    def concurrency(self, name: str) -> int:
        """The bulkhead of the partner stored as ``name``: calls in flight per process (0: none)."""
        return self.concurrencies.get(name, self.settings.partner_concurrency)

    def window(self, name: str) -> CallWindow:
        """This process's window of the latest calls of the partner stored as ``name``."""
        with self._lock:
            return self._entry(name).window

    def in_flight(self) -> dict[str, int]:
        """This process's calls in flight now, per partner it has called (stored names)."""
        with self._lock:
            return {name: local.bulkhead.in_flight for name, local in self._local.items()}

    def local(self, name: str) -> Local | None:
        """What this process keeps of the partner stored as ``name``, if anything."""
        with self._lock:
            return self._local.get(name)

    @contextlib.contextmanager
    def slot(self, name: str) -> Iterator[None]:
        """Hold a slot of ``name``'s bulkhead: wait briefly for one, else raise ``BulkheadFull``."""
        local = self._use(name)
        try:
            with local.bulkhead.slot(self.settings.partner_concurrency_wait_seconds):
                yield
        except Full as exc:
            raise self._full(name, exc) from exc
        finally:
            self._release(local)

    @contextlib.asynccontextmanager
    async def slot_async(self, name: str) -> AsyncIterator[None]:
        """``slot`` for a coroutine: the same bulkhead, awaited without blocking the loop."""
        local = self._use(name)
        try:
            async with local.bulkhead.slot_async(
                    self.settings.partner_concurrency_wait_seconds):
                yield
        except Full as exc:
            raise self._full(name, exc) from exc
        finally:
            self._release(local)

    def _full(self, name: str, exc: Full) -> BulkheadFull:
        until = self.store.now() + timedelta(
            seconds=self.settings.partner_concurrency_park_seconds)
        return BulkheadFull(name, until, f"bulkhead full: {exc}")

    def _use(self, name: str) -> Local:
        with self._lock:
            local = self._entry(name)
            local.users += 1
            return local

    def _release(self, local: Local) -> None:
        with self._lock:
            local.users -= 1

    def _entry(self, name: str) -> Local:
        """``name``'s entry, made on first use (the lock held); idle ones go past ``_TRACKED``."""
        local = self._local.get(name)
        if local is None:
            if len(self._local) >= _TRACKED:
                for idle in [key for key, entry in self._local.items() if entry.users == 0]:
                    del self._local[idle]
            local = self._local[name] = Local(
                Bulkhead(name, self.concurrency(name), self.monotonic),
                CallWindow(self.policy.slow.window))
        return local

    def rate(self, name: str) -> float:
        """Calls per second allowed to the partner stored as ``name`` (0: no limit)."""
        return self.rates.get(name, self.settings.partner_rate)

    async def pace_async(self, name: str) -> None:
        """``pace`` for the event loop: the take in a thread, the wait an ``asyncio.sleep``.

        A fake clock's ``sleep`` (tests) is called as it is: it only moves the clock.
        """
        if self.rate(name) <= 0:
            return
        if self.sleep is not time.sleep:
            await asyncio.to_thread(self.pace, name)
            return
        waits: list[float] = []
        await asyncio.to_thread(self.pace, name, waits.append)
        if waits:
            await asyncio.sleep(waits[0])

    def pace(self, name: str, wait: Callable[[float], None] | None = None) -> None:
        """Take a token of ``name``'s shared bucket; wait briefly for it or raise ``RateLimited``.

        One round trip: the store reserves the next token when it is at most
        ``partner_rate_wait_seconds`` away (this call then sleeps until it),
        else takes nothing and answers when the next one is free, the
        ``until`` the event is parked to. ``wait`` replaces ``sleep`` for this call
        (``pace_async`` collects the wait and sleeps on the loop).
        """
        rate = self.rate(name)
        if rate <= 0:
            return
        limit = RateLimit.per_second(rate, self.settings.partner_burst_seconds)
        longest = timedelta(seconds=max(0.0, self.settings.partner_rate_wait_seconds))
        took = self.store.rate_take(name, limit, longest)
        if not took.taken:
            raise RateLimited(name, took.until, f"over {rate:g} calls/s")
        if took.wait > timedelta(0):
            (wait or self.sleep)(took.wait.total_seconds())


async def _settled(bookkeeping: Awaitable[None]) -> bool:
    """Await the bookkeeping after a call that answered; True if cancelled meanwhile.

    Shielded: a cancellation (shutdown) that lands here must not drop an answer
    the partner already gave, or the guard would release its key and a
    redelivery call the partner again (issue 39, simulation seed 271). Every
    cancellation is absorbed until the count has landed (a shutdown whose
    grace ran out cancels a second time), then the caller goes on.
    """
    job = asyncio.ensure_future(bookkeeping)
    cancelled = False
    while not job.done():
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled = True
    job.result()  # the bookkeeping's own error, raised as an unshielded await raised it
    return cancelled
