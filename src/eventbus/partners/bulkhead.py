"""A bulkhead: at most ``limit`` calls of one partner in flight in this process.

Pure (the standard library only): ``eventbus.partners.call`` owns one per partner
(``Partners.bulkhead``), never a process global, so two services in one
process keep their own. One bulkhead serves threads and coroutines alike::

    with bulkhead.slot(timeout):                  # a sync handler's call
        ...
    async with bulkhead.slot_async(timeout):      # an async handler's call
        ...

Both count against the same ``in_flight``: a thread and a coroutine of the
same process share the cap. A slot not free within ``timeout`` seconds raises
``Full`` (``eventbus.partners.call`` turns it into ``BulkheadFull``, which parks the
event); a thread waits on a condition, a coroutine on a future of its own
loop that a leaving call (from any thread) resolves, so a waiting coroutine
never blocks its loop. ``limit`` 0 is no cap: slots are still counted, so
operators see the calls in flight.

Per process, on purpose: a cap is about this process's threads, sockets and
loop, and a shared count in the store would cost two writes per call and
leak a slot for every process that dies mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator


class Full(Exception):
    """Raised when no slot of the bulkhead came free within the wait."""

    def __init__(self, name: str, limit: int, waited: float) -> None:
        super().__init__(f"{limit} calls of {name!r} in flight, none ended within {waited:g} s")
        self.name, self.limit, self.waited = name, limit, waited


class Bulkhead:
    """One partner's cap on calls in flight, shared by the threads and coroutines of a process."""

    def __init__(self, name: str, limit: int,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``limit`` 0 (or less) is no cap; ``monotonic`` times the sync wait only."""
        self.name, self.limit = name, max(0, limit)
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._in_flight = 0
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.peak = 0
        """The most calls in flight at once since this bulkhead was made."""
        self.refused = 0
        """How many calls found it full past their wait (their events were parked)."""

    @property
    def in_flight(self) -> int:
        """Calls holding a slot now."""
        return self._in_flight

    def _take(self) -> bool:
        """Take a slot if one is free (the lock held)."""
        if self.limit and self._in_flight >= self.limit:
            return False
        self._in_flight += 1
        self.peak = max(self.peak, self._in_flight)
        return True

    def try_enter(self) -> bool:
        """Take a slot if one is free now, without waiting."""
        with self._lock:
            return self._take()

    def enter(self, timeout: float) -> None:
        """Take a slot, waiting up to ``timeout`` seconds for one; raise ``Full`` if none."""
        with self._lock:
            if self._take():
                return
            end = self._monotonic() + max(0.0, timeout)
            while True:
                left = end - self._monotonic()
                if left <= 0:
                    self.refused += 1
                    raise Full(self.name, self.limit, timeout)
                self._freed.wait(left)
                if self._take():
                    return

    async def enter_async(self, timeout: float) -> None:
        """Take a slot, awaiting up to ``timeout`` seconds for one; raise ``Full`` if none.

        The loop keeps running while this waits: a leaving call resolves the
        waiter's future through its loop (``call_soon_threadsafe``).
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout)
        while True:
            future: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if self._take():
                    return
                # Registered under the lock that ``leave`` takes: no wake-up is lost
                # between the failed take and the wait.
                self._waiting.append((loop, future))
            try:
                left = end - loop.time()
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(future, left)
            except TimeoutError:
                with self._lock:
                    if self._take():  # freed at the last moment, its wake-up still queued
                        return
                    self.refused += 1
                raise Full(self.name, self.limit, timeout) from None
            except BaseException:
                # Cancelled after a leaving call woke it: the wake-up goes to the next waiter.
                with self._lock:
                    if future.done() and not future.cancelled():
                        self._wake_one()
                raise
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiting.remove((loop, future))

    def leave(self) -> None:
        """Give a slot back and wake one waiting thread and one waiting coroutine."""
        with self._lock:
            self._in_flight -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        """Wake one waiting thread and one waiting coroutine (the lock held)."""
        self._freed.notify()
        # Both may race for the slot; the loser waits again (until its own end).
        while self._waiting:
            loop, future = self._waiting.pop(0)
            if future.done():
                continue  # timed out, leaving
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # its loop is closed: nobody waits there any more
                continue
            return

    @contextlib.contextmanager
    def slot(self, timeout: float) -> Iterator[None]:
        """Hold a slot while the block runs (``enter``, then ``leave``)."""
        self.enter(timeout)
        try:
            yield
        finally:
            self.leave()

    @contextlib.asynccontextmanager
    async def slot_async(self, timeout: float) -> AsyncIterator[None]:
        """Hold a slot while the block runs, awaiting it without blocking the loop."""
        await self.enter_async(timeout)
        try:
            yield
        finally:
            self.leave()


def _wake(future: asyncio.Future[None]) -> None:
    """Resolve a waiter's future on its own loop (it may have timed out meanwhile)."""
    if not future.done():
        future.set_result(None)
