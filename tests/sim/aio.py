"""An instance's event loop, stepped by the scheduler: every loop iteration is a point.

``SimHandlerLoop`` takes the place of a processor's ``HandlerLoop``
(``processor.handler_loop``): ``start(coroutines)`` runs them on a
``SimEventLoop`` in a thread of the instance's own (as the real loop runs in
its own thread), and returns a future whose ``result()`` is a scheduling
point that waits for them. The loop:

* reads **virtual time** (``time()`` is the scheduler's clock), so
  ``asyncio.sleep`` and ``call_later`` (a shutdown's grace) wait in virtual
  time;
* makes **every iteration a scheduling point** (``await``): its selector
  yields to the scheduler before it looks for ready callbacks, and blocks
  (giving up the baton) while nothing is ready;
* runs ``run_in_executor`` (``asyncio.to_thread``: the guard's and the
  lanes' store calls, a sync handler of a mixed lane) in a new thread of the
  same instance, so the coroutine that awaits it can be cancelled while the
  thread runs on, as with the real executor.

``cancel_after(grace)`` (``Processor.stop``) cancels the tasks still running
``grace`` virtual seconds later, as ``HandlerLoop.cancel_after`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import selectors
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from tests.sim.scheduler import Actor, Scheduler


class SimSelector(selectors.BaseSelector):
    """The real selector (for the loop's self-pipe), entered through the scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._real = selectors.DefaultSelector()
        self.scheduler = scheduler
        self.loop: SimEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """Delegate to the real selector."""
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        """Delegate to the real selector."""
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """Delegate to the real selector."""
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        """Delegate to the real selector."""
        return self._real.get_map()

    def close(self) -> None:
        """Close the real selector."""
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """A scheduling point; while nothing is ready, wait in virtual time or for a wake-up."""
        loop = self.loop
        assert loop is not None
        ready = self._real.select(0)
        if ready or loop.woken or timeout == 0:
            self.scheduler.point("await", ("pause", "crash", "shutdown", "tick"))
        else:
            wake = None if timeout is None else self.scheduler.now() + timeout
            self.scheduler.block(wake_at=wake, ready=lambda: loop.woken)
        loop.woken = False
        return ready + [pair for pair in self._real.select(0) if pair not in ready]


class SimEventLoop(asyncio.SelectorEventLoop):
    """A selector loop on virtual time whose executor threads are the instance's threads."""

    def __init__(self, scheduler: Scheduler, actor: Actor) -> None:
        self.scheduler, self.actor, self.woken = scheduler, actor, False
        selector = SimSelector(scheduler)
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        """Virtual time."""
        return self.scheduler.now()

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any,
                             context: Any = None) -> asyncio.Handle:
        """As asyncio's, and the loop's thread becomes runnable."""
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        self.woken = True
        return handle

    def run_in_executor(self, executor: Any, func: Callable[..., Any],
                        *args: Any) -> asyncio.Future[Any]:
        """Run ``func`` in a new thread of this instance; its result completes the future."""
        future: asyncio.Future[Any] = self.create_future()

        def settle(outcome: BaseException | None, value: Any) -> None:
            if future.cancelled():
                return
            if outcome is not None:
                future.set_exception(outcome)
            else:
                future.set_result(value)

        def body() -> None:
            try:
                value = func(*args)
            except BaseException as exc:
                with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                    self.call_soon_threadsafe(settle, exc, None)
                raise
            with contextlib.suppress(RuntimeError):
                self.call_soon_threadsafe(settle, None, value)

        self.scheduler.spawn(self.actor, body, f"{self.actor.name}/thread")
        return future


class SimFuture:
    """What ``SimHandlerLoop.start`` returns: ``result()`` waits (a point) until the loop ends."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.done = scheduler, False

    def result(self, timeout: float | None = None) -> None:
        """Wait for the coroutines to end."""
        if not self.done:
            self.scheduler.block(ready=lambda: self.done)


class SimHandlerLoop:
    """``HandlerLoop``'s interface on ``SimEventLoop``s (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, actor: Actor, concurrency: int = 100) -> None:
        self.scheduler, self.actor, self.concurrency = scheduler, actor, concurrency
        self.in_flight = 0
        self.most_in_flight = 0
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: set[SimEventLoop] = set()

    def start(self, coroutines: Sequence[Coroutine[Any, Any, None]]) -> SimFuture:
        """Run ``coroutines`` side by side on a loop in a thread of the instance."""
        future = SimFuture(self.scheduler)
        work = list(coroutines)

        def body() -> None:
            loop = SimEventLoop(self.scheduler, self.actor)
            self._loops.add(loop)
            main = self._all(work)
            try:
                loop.run_until_complete(main)
            finally:
                future.done = True
                self._loops.discard(loop)
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    loop.close()
                # A crashed instance's loop never ran them: closed, so no "never awaited"
                # warning surfaces later, in whichever test the collector runs in (a task
                # made just before the crash, such as the guard's shielded to_thread job,
                # counts too: only one that never started, as closing a started task's
                # would run its finally blocks outside the scheduler).
                for coroutine in (main, *work):
                    coroutine.close()
                for task in tasks:
                    unstarted = task.get_coro()
                    if inspect.iscoroutine(unstarted) and \
                            inspect.getcoroutinestate(unstarted) == inspect.CORO_CREATED:
                        unstarted.close()

        self.scheduler.spawn(self.actor, body, f"{self.actor.name}/loop")
        return future

    def run(self, coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
        """``start`` them and wait."""
        self.start(coroutines).result()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One handler in flight (no cap is reached in the simulation's small batches)."""
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1

    def cancel_after(self, grace: float) -> None:
        """Cancel the tasks still running ``grace`` virtual seconds from now."""

        def later() -> None:
            self.scheduler.block(wake_at=self.scheduler.now() + max(0.0, grace))
            self._cancel_all()

        self.scheduler.spawn(self.actor, later, f"{self.actor.name}/stop")

    def close(self, grace: float = 0.0) -> None:
        """Cancel what runs after ``grace``; later ``start`` calls cancel at once."""
        self.closed = True
        if self._tasks:
            self.scheduler.block(wake_at=self.scheduler.now() + max(0.0, grace),
                                 ready=lambda: not self._tasks)
            self._cancel_all()

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            loop = task.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

    async def _all(self, coroutines: list[Coroutine[Any, Any, None]]) -> None:
        tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
        self._tasks.update(tasks)
        if self.closed:
            for task in tasks:
                task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
