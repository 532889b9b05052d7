"""``eventbus.partners.bulkhead``: one cap for threads and coroutines, bounded waits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from eventbus.partners.bulkhead import Bulkhead, Full
from tests import aio


def test_a_full_bulkhead_refuses_after_its_wait_and_counts_the_refusal() -> None:
    ticks = iter([0.0, 0.0, 0.05, 0.2, 0.2])  # the wait's clock: past 0.1 s on the 3rd look
    bulkhead = Bulkhead("acme", 1, monotonic=lambda: next(ticks))
    bulkhead.enter(0)
    with pytest.raises(Full) as full:
        bulkhead.enter(0.1)
    assert (full.value.limit, bulkhead.refused, bulkhead.in_flight) == (1, 1, 1)
    bulkhead.leave()
    with bulkhead.slot(0):
        assert bulkhead.in_flight == 1
    assert (bulkhead.in_flight, bulkhead.peak) == (0, 1)


def test_a_waiting_thread_takes_the_slot_a_leaving_call_frees() -> None:
    bulkhead, took = Bulkhead("acme", 1), threading.Event()
    bulkhead.enter(0)

    def wait() -> None:
        with bulkhead.slot(10):
            took.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert not took.wait(0.05)  # held
    bulkhead.leave()
    assert took.wait(5)
    waiter.join(5)
    assert bulkhead.in_flight == 0


def test_no_cap_still_counts_calls_in_flight() -> None:
    bulkhead = Bulkhead("acme", 0)
    with bulkhead.slot(0), bulkhead.slot(0), bulkhead.slot(0):
        assert bulkhead.in_flight == 3
    assert (bulkhead.in_flight, bulkhead.peak, bulkhead.refused) == (0, 3, 0)


def test_coroutines_and_threads_share_one_cap_and_a_waiting_coroutine_never_blocks_its_loop(
        ) -> None:
    bulkhead = Bulkhead("acme", 2)
    most = 0
    lock = threading.Lock()

    def note() -> None:
        nonlocal most
        with lock:
            most = max(most, bulkhead.in_flight)

    async def call() -> None:
        async with bulkhead.slot_async(10):
            note()
            await asyncio.sleep(0.01)

    async def main() -> int:
        bulkhead.enter(0)  # a thread's call holds one slot
        ticks = 0

        async def ticker() -> None:  # runs only if waiting coroutines leave the loop free
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(ticker())
        calls = asyncio.gather(*(call() for _ in range(10)))
        await asyncio.sleep(0.05)
        threading.Thread(target=bulkhead.leave).start()  # freed from another thread
        await calls
        beat.cancel()
        return ticks

    ticks = aio.run(main())
    assert most == 2 and bulkhead.in_flight == 0 and bulkhead.peak == 2
    assert ticks > 10


def test_a_coroutine_over_the_cap_gives_up_after_its_wait() -> None:
    bulkhead = Bulkhead("acme", 1)
    bulkhead.enter(0)

    async def main() -> None:
        async with bulkhead.slot_async(0.02):
            pytest.fail("took a slot over the cap")

    with pytest.raises(Full):
        aio.run(main())
    assert (bulkhead.refused, bulkhead.in_flight) == (1, 1)


def test_a_cancelled_waiter_hands_its_wake_up_on() -> None:
    bulkhead = Bulkhead("acme", 1)

    async def main() -> None:
        bulkhead.enter(0)
        first = asyncio.create_task(bulkhead.enter_async(10))
        second = asyncio.create_task(bulkhead.enter_async(10))
        await asyncio.sleep(0.01)
        bulkhead.leave()  # wakes the first waiter...
        first.cancel()  # ...which is cancelled before it runs
        await asyncio.sleep(0.05)
        if first.cancelled():  # the wake-up went on to the second waiter
            await asyncio.wait_for(second, 2)
        else:  # asyncio.wait_for returned the woken future's result: the first holds it
            assert first.done() and not second.done()
            bulkhead.leave()
            await asyncio.wait_for(second, 2)

    aio.run(main())
    assert bulkhead.in_flight == 1  # the second waiter holds it; no slot leaked or lost
