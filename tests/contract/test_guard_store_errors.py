"""A store error on the guard's finish writes (issue 39 fault 4), on both stores.

The effect returns and its one SUCCESS write meets ``StoreUnavailable`` (a
failover). The guard must not drop the result: it retries the write while the
key is kept, and out of retries it holds the result so this process never
runs the effect again. ``Failover`` makes ``guard_finish`` fail; ``Waits`` is
the guard's sleeper and monotonic clock, so nothing sleeps for real, and its
hooks let another instance act, or the lease lapse, during the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from eventbus.guard import Guard
from eventbus.model.errors import LeaseHeld, PermanentError, StoreUnavailable, TransientError
from eventbus.store.base import EventStore
from tests import aio
from tests.contract.conftest import LEASE, StoreClock, caller_clock, new_key

RESULT = {"status_code": 201, "order": "p-77"}


class Failover:
    """``store`` whose ``guard_finish`` of one kind (SUCCESS or FAILED) fails ``fails`` times.

    ``applied``: the write reaches the store before the error (the reply is what
    the failover lost), the harder case for a retry.
    """

    def __init__(self, store: EventStore, fails: int, *, succeeded: bool = True,
                 applied: bool = False) -> None:
        self._store, self.fails, self.succeeded, self.applied = store, fails, succeeded, applied
        self.writes: list[bool] = []
        self.before_write: Callable[[], None] = lambda: None
        self.stored = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def guard_finish(self, key: str, owner: str, now: datetime, *, succeeded: bool,
                     result: dict[str, Any]) -> bool:
        self.writes.append(succeeded)
        self.before_write()
        if succeeded == self.succeeded and self.fails > 0:
            self.fails -= 1
            if self.applied:
                self._store.guard_finish(key, owner, now, succeeded=succeeded, result=result)
            raise StoreUnavailable("primary stepped down")
        done = self._store.guard_finish(key, owner, now, succeeded=succeeded, result=result)
        if succeeded:
            self.stored.set()
        return done


class Waits:
    """The guard's ``sleep`` and ``monotonic``: time moves only when the guard waits."""

    def __init__(self) -> None:
        self.elapsed, self.delays = 0.0, []
        self.hooks: dict[int, Callable[[], None]] = {}
        """Run at the guard's nth wait (1-based): another instance acting meanwhile."""

    def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.elapsed += seconds
        self.hooks.pop(len(self.delays), lambda: None)()

    def monotonic(self) -> float:
        return self.elapsed


class Kept:
    """A keeper that says whether the key is kept now (the processor's heartbeat)."""

    def __init__(self) -> None:
        self.now: set[str] = set()

    @contextlib.contextmanager
    def __call__(self, key: str, owner: str) -> Iterator[None]:
        self.now.add(key)
        try:
            yield
        finally:
            self.now.discard(key)


def guard(store: Any, clock: Callable[[], datetime], waits: Waits | None = None,
          keep: Kept | None = None) -> Guard:
    waits = waits or Waits()
    built = Guard(store, lease=LEASE, now=clock, keep=keep)
    # Set after construction (the same as the constructor's ``sleep=``/``monotonic=``), so
    # that on the code before the fix these tests fail on behaviour, not on a keyword.
    built.sleep, built.monotonic = waits.sleep, waits.monotonic
    return built


class Partner:
    """A partner that counts its calls; ``answers`` are raised in turn, then RESULT."""

    def __init__(self, *answers: BaseException) -> None:
        self.calls, self.answers = 0, list(answers)

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.answers:
            raise self.answers.pop(0)
        return dict(RESULT)

    async def call_async(self) -> dict[str, Any]:
        await asyncio.sleep(0)
        return self()


def deliver(run: Callable[[], Any]) -> Any:
    """One delivery: its Guarded, or the transient error the processor would answer 503 for."""
    try:
        return run()
    except TransientError as exc:
        return exc


@pytest.mark.parametrize("applied", [False, True], ids=["lost-write", "lost-reply"])
def test_a_failed_success_write_is_retried_and_the_partner_is_called_once(
        store: EventStore, store_clock: StoreClock, now: datetime, applied: bool) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=3, applied=applied), Waits()
    first = deliver(lambda: guard(down, clock, waits).run(key, partner))
    # The redelivery, after the first attempt's lease would have lapsed, on another instance.
    clock.advance(LEASE.total_seconds() * 2)
    again = deliver(lambda: guard(store, clock).run(key, partner))
    assert partner.calls == 1
    assert (first.skipped, dict(first.result)) == (False, RESULT)
    assert (again.skipped, dict(again.result)) == (True, RESULT)
    assert waits.delays == [0.05, 0.1, 0.2]  # a short doubling backoff, never a real sleep
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"]) == ("SUCCESS", RESULT)


def test_the_key_stays_held_while_the_write_is_retried(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits, kept = Failover(store, fails=2), Waits(), Kept()
    kept_at_writes: list[bool] = []
    down.before_write = lambda: kept_at_writes.append(key in kept.now)
    duplicates: list[BaseException | Any] = []
    # A duplicate delivery during the outage finds the key held: it cannot call the partner.
    waits.hooks[1] = lambda: duplicates.append(deliver(lambda: guard(store, clock).run(
        key, partner)))
    done = guard(down, clock, waits, keep=kept).run(key, partner)
    assert (done.skipped, partner.calls) == (False, 1)
    assert kept_at_writes == [True, True, True]
    assert [type(found) for found in duplicates] == [LeaseHeld]


def test_a_late_success_after_the_lease_lapsed_is_stored_and_stops_a_third_call(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # The outage outlasts the lease (no renewal reaches the store either); another
    # instance takes the lapsed key and its partner call fails. The first's late
    # SUCCESS is still stored (the store's success write is set whoever holds the
    # key: the effect happened); the other's owner-fenced FAILED came first and
    # cannot undo it; a third delivery makes no third call.
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=2), Waits()
    other = Partner(TransientError("partner answered 503"))

    def lapse_and_take() -> None:
        clock.advance(LEASE.total_seconds() * 2)
        with pytest.raises(TransientError):
            guard(store, clock).run(key, other)
    waits.hooks[2] = lapse_and_take
    done = guard(down, clock, waits).run(key, partner)
    assert (done.skipped, dict(done.result)) == (False, RESULT)
    third = guard(store, clock).run(key, partner)
    assert (third.skipped, dict(third.result)) == (True, RESULT)
    assert (partner.calls, other.calls) == (1, 1)
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"]) == ("SUCCESS", RESULT)


def test_out_of_retries_the_result_is_held_and_never_called_again_here(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=1000), Waits()
    here = guard(down, clock, waits)
    with pytest.raises(StoreUnavailable):
        here.run(key, partner)
    # Bounded: a few writes within half a lease of this process's time.
    assert 1 < len(down.writes) <= Guard.retry_tries
    assert sum(waits.delays) <= LEASE.total_seconds() / 2
    # The outage outlasts the lease. A redelivery here while still down: no call.
    clock.advance(LEASE.total_seconds() * 2)
    assert isinstance(deliver(lambda: here.run(key, partner)), StoreUnavailable)
    # The store is back: the next delivery here stores the held result, no call.
    down.fails = 0
    again = here.run(key, partner)
    assert (again.skipped, dict(again.result), partner.calls) == (True, RESULT, 1)
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"]) == ("SUCCESS", RESULT)
    assert guard(store, clock).run(key, partner).skipped


def test_a_store_error_on_the_failed_write_keeps_the_effects_own_error(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key = caller_clock(store_clock, now), new_key()
    partner = Partner(PermanentError("partner refused the order"))
    down = Failover(store, fails=1, succeeded=False)
    with pytest.raises(PermanentError) as raised:
        guard(down, clock).run(key, partner, classify=lambda exc: "permanent")
    assert any("primary stepped down" in note for note in raised.value.__notes__)
    assert down.writes == [False]  # not retried: the lease lapses by itself
    # Unreleased, the key is held for its lease, then taken again (the effect failed).
    assert isinstance(deliver(lambda: guard(store, clock).run(key, partner)), LeaseHeld)
    clock.advance(LEASE.total_seconds() * 2)
    assert guard(store, clock).run(key, partner).skipped is False
    assert partner.calls == 2


def test_run_async_retries_the_write_off_the_loop_and_calls_once(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=3), Waits()
    threads: list[str] = []
    down.before_write = lambda: threads.append(threading.current_thread().name)

    async def main() -> tuple[Any, str]:
        found = await guard(down, clock, waits).run_async(key, partner.call_async)
        return found, threading.current_thread().name
    done, loop_thread = aio.run(main())
    assert (done.skipped, dict(done.result), partner.calls) == (False, RESULT, 1)
    assert len(threads) == 4 and loop_thread not in threads
    clock.advance(LEASE.total_seconds() * 2)
    assert guard(store, clock).run(key, partner).skipped


def test_a_shutdown_during_the_retries_cancels_the_wait_not_the_write(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down = Failover(store, fails=1)
    writing, failover_over = threading.Event(), threading.Event()

    def first_write_hangs() -> None:
        if len(down.writes) == 1:
            writing.set()
            failover_over.wait(10)
    down.before_write = first_write_hangs

    async def main() -> None:
        task = asyncio.ensure_future(guard(down, clock).run_async(key, partner.call_async))
        await asyncio.to_thread(writing.wait, 10)
        task.cancel()  # the shutdown's grace ran out while the write is in its failover
        with pytest.raises(asyncio.CancelledError):
            await task
        failover_over.set()  # the store comes back after the handler was cancelled
    aio.run(main())
    assert down.stored.wait(10), "the held result was dropped with the cancelled wait"
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"], partner.calls) == ("SUCCESS", RESULT, 1)
    clock.advance(LEASE.total_seconds() * 2)
    assert guard(store, clock).run(key, partner).skipped
