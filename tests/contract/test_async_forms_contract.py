"""The async forms of the guard and a partner call (``run_async``, ``call_async``), both stores.

They must decide exactly as the sync forms do (the same stored guard
records, the same breaker and rate transitions: a sync and an async call of
one partner count toward one breaker), and their store calls must run off the
event loop: a store wrapper records the thread of each call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import pytest

from eventbus.guard import Guard
from eventbus.model.errors import (
    BreakerOpen,
    LeaseHeld,
    PermanentError,
    RateLimited,
    TransientError,
)
from eventbus.partners import OPEN, Partners
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from eventbus.testing import FakeClock
from tests import aio
from tests.contract.conftest import LEASE, StoreClock, new_key
from tests.partner_stores import beside

T = TypeVar("T")
SETTINGS = Settings(breaker_failures=3, breaker_open_seconds=30, breaker_open_cap_seconds=100,
                    breaker_probe_seconds=10, partner_rate_wait_seconds=1.0)


class Threads:
    """A store proxy that records which thread made each call (the loop's must make none)."""

    def __init__(self, store: EventStore) -> None:
        self._store, self.calls = store, []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found) or name == "now":
            return found

        def called(*args: Any, **kwargs: Any) -> Any:
            # Names, not idents: an ident is reused once its thread ends, and every loop
            # thread here is named by tests.aio while the store calls' threads are asyncio's.
            self.calls.append((name, threading.current_thread().name))
            return found(*args, **kwargs)
        return called


def on_loop(coroutine: Callable[[], Awaitable[T]]) -> tuple[T, str]:
    """Run ``coroutine()`` on a fresh loop in a thread of its own (``tests.aio``); its result
    and the loop thread's name."""
    async def main() -> tuple[T, str]:
        return await coroutine(), threading.current_thread().name
    return aio.run(main())


def guard(store: Any, clock: Callable[[], datetime]) -> Guard:
    return Guard(store, lease=LEASE, now=clock)


async def effect_ok() -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"status_code": 200}


async def effect_down() -> dict[str, Any]:
    await asyncio.sleep(0)
    raise TransientError("partner answered 503")


def test_run_async_runs_once_stores_the_result_and_skips_after(store: EventStore,
                                                               now: datetime) -> None:
    watched, key, calls = Threads(store), f"notify:{new_key()}", []

    async def effect() -> dict[str, Any]:
        calls.append(1)
        return await effect_ok()

    (first, loop_thread) = on_loop(lambda: guard(watched, lambda: now).run_async(key, effect))
    (second, _) = on_loop(lambda: guard(watched, lambda: now).run_async(key, effect))
    assert (first.skipped, dict(first.result)) == (False, {"status_code": 200})
    assert (second.skipped, dict(second.result)) == (True, {"status_code": 200})
    assert calls == [1]
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"]) == ("SUCCESS", {"status_code": 200})
    # Every store call went to a thread; none blocked the loop.
    assert {name for name, _ in watched.calls} == {"guard_take", "guard_finish"}
    assert all(thread != loop_thread for _, thread in watched.calls)


def test_run_async_failure_is_stored_released_and_raised_like_run(store: EventStore,
                                                                  now: datetime) -> None:
    key = f"notify:{new_key()}"
    with pytest.raises(TransientError):
        on_loop(lambda: guard(store, lambda: now).run_async(key, effect_down))
    record = store.guard_get(key) or {}
    assert record["status"] == "FAILED"
    assert record["error"]["classification"] == "transient"
    # Released: the next try runs at once, as after a sync failure.
    (again, _) = on_loop(lambda: guard(store, lambda: now).run_async(key, effect_ok))
    assert not again.skipped


def test_a_cancelled_effect_releases_its_lease(store: EventStore, now: datetime) -> None:
    key, entered = f"notify:{new_key()}", asyncio.Event()

    async def hangs() -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(60)
        return {}

    async def cancel() -> None:
        task = asyncio.ensure_future(guard(store, lambda: now).run_async(key, hangs))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    on_loop(cancel)
    assert (store.guard_get(key) or {})["status"] == "FAILED"
    (after, _) = on_loop(lambda: guard(store, lambda: now).run_async(key, effect_ok))
    assert not after.skipped  # not held: a redelivery may call again


def test_run_async_respects_a_live_lease_of_another_caller(store: EventStore,
                                                          now: datetime) -> None:
    key = f"notify:{new_key()}"
    assert store.guard_take(key, "someone-else", now, LEASE) is None
    with pytest.raises(LeaseHeld):
        on_loop(lambda: guard(store, lambda: now).run_async(key, effect_ok))


def partners(store: Any, store_clock: StoreClock) -> Partners:
    return Partners(store, SETTINGS, now=FakeClock(datetime.now().astimezone()),
                    sleep=store_clock.advance)


def test_call_async_opens_the_breaker_as_call_does_and_counts_with_it(
        store: EventStore, store_clock: StoreClock) -> None:
    watched = Threads(beside(store))  # the partners' store: breakers and rates are there
    group = partners(watched, store_clock)
    name = f"acme-{new_key()[-8:]}"

    def sync_down() -> None:
        raise TransientError("partner answered 503")

    for _ in range(2):  # two sync failures, then an async one: the third opens it
        with pytest.raises(TransientError):
            group.get(name).call(sync_down)
    with pytest.raises(BreakerOpen) as opened:
        on_loop(lambda: group.get(name).call_async(effect_down))
    assert isinstance(opened.value.__cause__, TransientError)
    assert (beside(store).breaker_get(name) or {})["state"] == OPEN
    calls: list[int] = []

    async def counted() -> int:
        calls.append(1)
        return 1

    with pytest.raises(BreakerOpen):  # open: not called
        on_loop(lambda: group.get(name).call_async(counted))
    assert calls == []
    store_clock.advance(31)  # past the open time: the probe goes and closes it
    watched.calls.clear()  # the sync calls above ran on this thread, as asyncio.run's loop does
    (answer, loop_thread) = on_loop(lambda: group.get(name).call_async(counted))
    assert answer == 1 and calls == [1]
    assert (beside(store).breaker_get(name) or {})["state"] == "closed"
    assert watched.calls and all(thread != loop_thread for _, thread in watched.calls)


def test_call_async_counts_a_permanent_answer_as_an_answer(store: EventStore,
                                                          store_clock: StoreClock) -> None:
    group, name = partners(beside(store), store_clock), f"globex-{new_key()[-8:]}"

    async def refused() -> None:
        raise PermanentError("no such order")

    for _ in range(5):
        with pytest.raises(PermanentError):
            on_loop(lambda: group.get(name).call_async(refused))
    assert (beside(store).breaker_get(name) or {}).get("state", "closed") == "closed"


def test_call_async_takes_the_shared_rate_and_parks_past_it(store: EventStore,
                                                           store_clock: StoreClock) -> None:
    rated = Settings(partner_rate=1.0, partner_burst_seconds=1.0, partner_rate_wait_seconds=0.5)
    group = Partners.beside(store, rated, now=FakeClock(datetime.now().astimezone()),
                     sleep=store_clock.advance)
    name = f"initech-{new_key()[-8:]}"
    (first, _) = on_loop(lambda: group.get(name).call_async(effect_ok))
    assert first == {"status_code": 200}
    with pytest.raises(RateLimited) as limited:  # the next token is a second away: parked
        on_loop(lambda: group.get(name).call_async(effect_ok))
    assert limited.value.until > store.now() + timedelta(milliseconds=400)


def test_call_async_opens_on_slow_running_calls_off_the_loop_and_forgets_cancelled_ones(
        store: EventStore) -> None:
    ticks = [1000.0]
    recorder = Threads(beside(store))  # the partners' store: breakers and rates are there
    slow = Settings(breaker_failures=3, breaker_open_seconds=30, breaker_slow_seconds=2.0,
                    breaker_slow_share=0.5, breaker_slow_min_calls=4, breaker_slow_window=4)
    group = Partners(cast(Any, recorder), slow, monotonic=lambda: ticks[0], sleep=lambda _: None)
    name = f"slowco-{new_key()}"
    window = group.window(name)

    async def scenario() -> list[Any]:
        release = asyncio.Event()

        async def waits() -> dict[str, Any]:
            await release.wait()
            return {"status_code": 200}

        tasks = [asyncio.ensure_future(group.get(name).call_async(waits)) for _ in range(4)]
        while window.tally_now(float("inf"), 0.0)[1] < 4:
            await asyncio.sleep(0.001)
        ticks[0] += 3.0  # all four running for 3 s: slow before any answered
        recorder.calls.clear()
        with pytest.raises(BreakerOpen):
            await group.get(name).call_async(effect_ok)
        tasks[0].cancel()
        tasks[1].cancel()
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    (results, loop_thread) = on_loop(scenario)
    assert recorder.calls and all(thread != loop_thread for _, thread in recorder.calls)
    assert [type(result).__name__ for result in results] == \
        ["CancelledError", "CancelledError", "dict", "dict"]
    stored = beside(store).breaker_get(name) or {}
    assert stored["state"] == OPEN and stored["reason"]["running"] == 4
    # The cancelled calls run no more; the two that answered counted as slow.
    assert window.tally_now(float("inf"), 0.0)[1] == 0
    assert stored["slow_calls"] == 2
