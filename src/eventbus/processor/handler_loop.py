"""The processor's event loop, where ``async def`` handlers run: one per processor, in a thread.

Threads cap a waiting handler at one per thread; a coroutine waiting on a
partner costs a few kilobytes. So a batch's async handlers (``Route.is_async``)
run here side by side, while its sync handlers run as before, on the batch's
threads (a batch may mix both). The caller (the pull worker's batch thread, a
push request's thread) waits for them as it waits for its thread pool.

* **Started lazily**, with the first async handler, in a daemon thread of its
  own; ``close()`` ends it. Nothing is global: the loop belongs to this object,
  which belongs to its ``Processor``.
* **Capped.** At most ``concurrency`` handlers await at once in the process
  (``Settings.async_concurrency``), whatever the number of batches or push
  requests in flight: the others wait for a ``slot``. ``in_flight`` and
  ``most_in_flight`` say how many did.
* **Blocking found.** A handler that blocks the loop by mistake (``time.sleep``,
  a sync HTTP client inside ``async def``) stalls every handler of the process.
  A watchdog thread sees the loop's tick fall behind by ``block_warning``
  seconds and logs a warning naming the handler and its event (the loop's
  current task), then how long the block lasted. The results stay correct; only
  time is lost. (asyncio's debug mode finds slow callbacks too, after they end
  and at the cost of debug mode on every call; the watchdog names the culprit
  while it blocks, for one wake-up per ``block_warning / 2``.) It ends with the
  loop: ``close()`` stops and joins it before it stops the loop, so it neither
  outlives its loop (nor the test that made it) nor takes the loop's own stop
  for a block.
* **Stopped.** ``cancel_after(grace)`` (a worker's ``stop()``: it never blocks)
  and ``close(grace)`` cancel the handlers still awaiting after ``grace``
  seconds. A cancelled handler's event is given back by the processor (its
  claim returned, answered IN_PROGRESS: nacked or 503), so it comes back;
  what its guard had started is finished or released by the guard.
* **Store calls off the loop.** The loop's default executor (``asyncio.to_thread``:
  the async guard and partner forms' store calls) has ``io_threads`` threads,
  so a hundred handlers' store calls do not queue behind asyncio's default of
  ``min(32, cores + 4)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

logger = logging.getLogger("eventbus.async")

IO_THREADS = 32
"""Threads of the loop's executor: the store calls of the async guard and partner forms."""


class HandlerLoop:
    """An asyncio loop in a thread of its own, with a cap on handlers in flight (see the module)."""

    def __init__(self, concurrency: int = 100, *, block_warning: float = 0.5,
                 io_threads: int = IO_THREADS) -> None:
        self.concurrency = max(1, concurrency)
        self.block_warning = block_warning
        self.io_threads = io_threads
        self.in_flight = 0
        """Handlers awaiting now (inside a ``slot``)."""
        self.most_in_flight = 0
        """The most handlers that awaited at once since the loop started."""
        self.closed = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._beat = time.monotonic()
        self._stopped = threading.Event()

    # -- running ---------------------------------------------------------------------
    def start(self, coroutines: Sequence[Coroutine[Any, Any, None]]) -> Future[None]:
        """Run ``coroutines`` side by side on the loop; a future that is done when all are.

        Each runs as a task of its own; one that raises does not stop the
        others (the processor's coroutines never raise for a message). After
        ``close`` they are cancelled at once (their events are given back).
        """
        work = list(coroutines)
        with self._lock:
            # Handed to the loop under the lock ``close`` takes before its drain: the loop runs
            # them before the drain (which cancels them), or ``closed`` is seen here.
            if not self.closed:
                return asyncio.run_coroutine_threadsafe(self._all(work), self._started())
        # A late push or batch after ``close`` (issue 39): the loop is closed, or going
        # away, and none starts again. Nothing runs: the processor gives every event of
        # them back (PENDING, the attempt not spent: IN_PROGRESS, nacked or 503).
        for coroutine in work:
            coroutine.close()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def run(self, coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
        """``start`` them and wait until all are done (the calling thread blocks)."""
        self.start(coroutines).result()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``concurrency`` places for one handler's run."""
        assert self._slots is not None, "slot() is used on the loop, inside start()"
        async with self._slots:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                yield
            finally:
                self.in_flight -= 1

    def cancel_after(self, grace: float) -> None:
        """Cancel the handlers still awaiting ``grace`` seconds from now; returns at once."""
        with self._lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing to cancel
                loop.call_soon_threadsafe(loop.call_later, max(0.0, grace), self._cancel_all)

    def close(self, grace: float = 0.0) -> None:
        """Cancel what still awaits after ``grace`` seconds, wait for it to unwind, end the loop.

        Later ``start`` calls cancel their coroutines at once (a late push's
        event is given back, never run on a loop that is going away).
        """
        with self._lock:
            self.closed = True
            loop, thread, watcher = self._loop, self._thread, self._watcher
        if loop is None or thread is None or loop.is_closed():  # never started, or closed
            return
        try:
            asyncio.run_coroutine_threadsafe(self._drain(grace), loop).result()
        finally:
            # The watchdog first, whatever the drain did: joined, so no thread of this loop
            # outlives ``close``, and stopped before the loop, whose stop is no block.
            self._stopped.set()
            if watcher is not None:
                watcher.join()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    # -- the loop's side -------------------------------------------------------------
    async def _all(self, coroutines: list[Coroutine[Any, Any, None]]) -> None:
        tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
        self._tasks.update(tasks)
        if self.closed:
            for task in tasks:
                task.cancel()
        try:
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, BaseException) and \
                        not isinstance(outcome, asyncio.CancelledError):
                    logger.error("an async lane failed", exc_info=outcome)
        finally:
            self._tasks.difference_update(tasks)

    async def _drain(self, grace: float) -> None:
        if self._tasks and grace > 0:
            await asyncio.wait(set(self._tasks), timeout=grace)
        while self._tasks:
            pending = set(self._tasks)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        loop = asyncio.get_running_loop()
        await loop.shutdown_default_executor()

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _started(self) -> asyncio.AbstractEventLoop:
        """The loop, started if it is not yet; the caller holds ``_lock``."""
        if self._loop is not None:
            return self._loop
        loop = asyncio.new_event_loop()
        loop.set_default_executor(ThreadPoolExecutor(self.io_threads,
                                                     thread_name_prefix="eventbus-async-io"))
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(loop, ready),
                                        name="eventbus-async", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop
        if self.block_warning > 0:
            self._watcher = threading.Thread(target=self._watch, args=(loop,),
                                             name="eventbus-async-watch", daemon=True)
            self._watcher.start()
        return loop

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        self._slots = asyncio.Semaphore(self.concurrency)
        loop.call_soon(ready.set)
        if self.block_warning > 0:
            loop.call_soon(self._tick, loop)
        loop.run_forever()

    def _serving(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        # The watchdog reads this: a tick that falls behind means a callback holds the loop.
        self._beat = time.monotonic()
        loop.call_later(self.block_warning / 4, self._tick, loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        blocked_since: float | None = None
        # Ends when ``close`` says so, or when the loop's thread is gone without it (an
        # interpreter going down): a watchdog never reports on a loop that cannot run.
        while not self._stopped.wait(self.block_warning / 2) and self._serving():
            lag = time.monotonic() - self._beat
            if lag > self.block_warning and blocked_since is None:
                blocked_since = self._beat
                task = asyncio.current_task(loop)  # a read of the loop's current task only
                culprit = task.get_name() if task is not None else "a callback"
                logger.warning(
                    "%s has blocked the event loop for %.1f s: every async handler of this "
                    "process waits meanwhile. Inside async def, await (asyncio.sleep, an async "
                    "client) or hand blocking calls to a thread (await asyncio.to_thread(...))",
                    culprit, lag, extra={"blocking": culprit})
            elif lag <= self.block_warning and blocked_since is not None:
                logger.warning("the event loop ran again after %.1f s blocked",
                               self._beat - blocked_since)
                blocked_since = None
