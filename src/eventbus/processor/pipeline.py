"""The state machine as stages over a batch: locate, claim, handle, finish, relay.

``Processor.run(deliveries)`` takes a batch (the pull worker's N, push's one;
``process(delivery)`` is a batch of one) and runs each stage once over it:

1. **locate** every delivery once (``Intake.locate``); a second delivery of a
   key already in the batch follows the first one's outcome;
2. **refuse** what can never run (stored FAILED for good, bounded);
3. **claim** every routed key in one ``claim_many``;
4. **handle**: each claimed event's handler (``concurrency`` threads for a
   batch; ``async def`` handlers side by side on the processor's event loop,
   ``HandlerLoop``), under leases the ``Heartbeat`` renews; the outcome waits;
5. **finish**: one ``finish_many`` stores every outcome; a lease another
   worker took meanwhile, or children the store refuses, settle the answer;
6. **relay**: ``after_success`` (the inline relay) for each SUCCESS with
   children, once its parent is stored (a hook with ``relay_many`` gets the
   batch's at once).

A store that cannot be reached leaves every undecided item UNAVAILABLE. The
stages make no telemetry calls: observers are ``Middleware`` around them.
Where a mode may decide otherwise (what the claim takes, what a handler's
success or failure stores, ...), a stage calls the processor's ``mode``
(``eventbus.processor.mode.Mode``: those steps, declared; live: ``LiveMode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from eventbus.clock import Now
from eventbus.correlation import tracecontext
from eventbus.guard import Guard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import (
    AttemptCapReached,
    Classifier,
    ContentRejected,
    Expired,
    StoreUnavailable,
)
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.processor.handler_loop import HandlerLoop
from eventbus.processor.heartbeat import Heartbeat, Lease
from eventbus.processor.intake import Intake, Located
from eventbus.processor.middleware import Middleware
from eventbus.processor.mode import LiveMode, Mode, attempt_cap
from eventbus.processor.ordering import Lane, Lanes, applied_fields
from eventbus.processor.rejections import Rejections
from eventbus.processor.work import Item, Pending, Result
from eventbus.settings import Settings
from eventbus.store.base import (
    EntityHolds,
    EntityRelease,
    Finish,
    ProcessorStore,
)

if TYPE_CHECKING:  # handed in by eventbus.assembly: the core never imports a feature
    from eventbus.partners import Partners

logger = logging.getLogger("eventbus")

AfterSuccess = Callable[[str, Sequence[Mapping[str, Any]]], None]
Outboxes = Sequence[tuple[str, Sequence[Mapping[str, Any]]]]
"""A batch's SUCCESS parents with children: ``(parent_key, outbox)`` each."""
_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_NO_HOLDS: contextlib.nullcontext[dict[str, Lease]] = contextlib.nullcontext({})
_T = TypeVar("_T")


@runtime_checkable
class BatchAfterSuccess(Protocol):
    """An ``after_success`` hook that also takes a batch at once (the inline ``Relay``)."""

    def __call__(self, parent_key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
        """Handle one parent's children."""
        ...

    def relay_many(self, outboxes: Outboxes) -> None:
        """Handle a batch's parents at once; never raises for a parent."""
        ...

    def close(self) -> None:
        """Stop the threads it keeps for batches."""
        ...


Clock = Now
"""The processor's clock: ``eventbus.clock.Now`` (tests pass a ``FakeClock`` to move time)."""


class Processor:
    """Runs batches of deliveries through the state machine against a store and a router."""

    def __init__(self, store: ProcessorStore, router: Router, settings: Settings, now: Clock,
                 after_success: AfterSuccess | None = None,
                 classifier: Classifier | None = None, heartbeat: Heartbeat | None = None,
                 middleware: Sequence[Middleware] = (), concurrency: int = 1,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 partners: Partners | None = None,
                 mode: Callable[[Processor], Mode] = LiveMode) -> None:
        self.store, self.router, self.settings, self.now = store, router, settings, now
        router.check()  # a forward of an internal or unhandled type stops the app here
        self.after_success, self.middleware = after_success, tuple(middleware)
        self._span_scoped = any(hook.scopes_logs for hook in self.middleware)
        self.classifier = classifier or Classifier()
        self.heartbeat = heartbeat or Heartbeat(store, now=now)
        # The guard's SUCCESS-write retries wait on the processor's own clocks (a test's
        # fake clock, the simulation's virtual time), as the lanes and partners do.
        self.guard = Guard(store, lease=store.lease, now=now, keep=self.heartbeat.guarding,
                           sleep=sleep, monotonic=monotonic)
        self.partners = partners
        """What ``context.partner`` calls through (``eventbus.assembly.partners_of`` builds
        them); None: a handler's ``context.partner`` raises, saying so."""
        self.intake, self.rejections = Intake(store, router), Rejections(store, now)
        self.lanes = Lanes(store, now, settings.order_wait_seconds, sleep=sleep,
                           redrive_after=timedelta(seconds=settings.redrive_after_seconds),
                           monotonic=monotonic)
        self._monotonic = monotonic
        self.concurrency = max(1, concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self.handler_loop = HandlerLoop(settings.async_concurrency,
                                        block_warning=settings.async_block_warning_seconds)
        """Where ``async def`` handlers run: one loop, started with the first of them."""
        self.mode: Mode = mode(self)
        """The steps the stages call where a mode may decide otherwise (``Mode``; live:
        ``LiveMode``, a rebuild: ``eventbus.rebuild.mode.ReplayMode``), built with this
        processor."""

    def ensure_indexes(self) -> None:
        """Prepare the store and the partners' store it was handed (their indexes)."""
        self.store.ensure_indexes()
        if self.partners is not None:
            self.partners.store.ensure_indexes()

    def locate(self, delivery: Delivery) -> Located:
        """Return the key and record fields ``delivery`` gets (see ``Intake.locate``)."""
        return self.intake.locate(delivery)

    def process(self, delivery: Delivery, request_id: str = "") -> Result:
        """Process one delivery (a batch of one); never raises for anything it holds."""
        return self.run([delivery], request_id)[0]

    def run(self, deliveries: Sequence[Delivery], request_id: str = "") -> list[Result]:
        """Process ``deliveries``: one ``Result`` each, in order; never raises for a message."""
        items = [Item(delivery, request_id or uuid.uuid4().hex) for delivery in deliveries]
        # Log lines group by the message's trace (a batch: each handler's own),
        # unless a middleware scopes them to the message's span.
        scope = tracecontext.adopt(tracecontext.message_trace(deliveries[0].attributes),
                                   items[0].request_id) \
            if len(items) == 1 and not self._span_scoped else None
        try:
            with self._observed(items) if self.middleware else _NOTHING:
                self._stages(items)
        finally:
            tracecontext.leave(scope)
        return [item.result or _unavailable("no result") for item in items]

    def stop(self, grace: float | None = None) -> None:
        """Cancel the async handlers still awaiting ``grace`` seconds from now; returns at once.

        A worker's ``stop()`` calls it (default ``Settings.async_stop_grace_seconds``):
        a cancelled handler's event is given back (IN_PROGRESS: nacked, its attempt
        not spent), so the batch in flight ends soon and nothing is lost.
        """
        self.handler_loop.cancel_after(self.settings.async_stop_grace_seconds
                                       if grace is None else grace)

    def close(self, grace: float | None = None) -> None:
        """Stop the async handlers (see ``stop``: cancelled after ``grace`` seconds, their
        events given back), the handler threads of batches (after the batch in flight),
        the heartbeat's thread, and the hook's; every thread joined."""
        self.handler_loop.close(self.settings.async_stop_grace_seconds
                                if grace is None else grace)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        # After the batches: their leases were renewed until they ended.
        self.heartbeat.close()
        if isinstance(self.after_success, BatchAfterSuccess):
            self.after_success.close()

    # -- the stages -------------------------------------------------------------------
    def _stages(self, items: list[Item]) -> None:
        try:
            self._locate(items)
            self._refuse(items)
            self._handle(*self._claim(items), alone=len(items) == 1)
        except StoreUnavailable as exc:
            logger.warning("store unavailable: %s", exc)
            for item in items:
                if _undecided(item):
                    item.result = _unavailable(type(exc).__name__)
        self._relay(items)
        for item in items:
            if item.leader is not None:
                item.result = _follow(item.leader.result or _unavailable("no result"))

    def _locate(self, items: list[Item]) -> None:
        first: dict[str, Item] = {}
        for item in items:
            item.located = located = self.intake.locate(item.delivery)
            item.key, item.routed = located.key, located.error is None
            item.event_type = located.event.event_type if located.event is not None else ""
            if item.routed:
                leader = first.setdefault(item.key, item)
                item.leader = None if leader is item else leader

    def _refuse(self, items: list[Item]) -> None:
        refused = [item for item in items if item.located and item.located.error]
        if refused:
            with self._around("finish", refused) if self.middleware else _NOTHING:
                for item in refused:
                    assert item.located is not None and item.located.error is not None
                    item.result = self.rejections.reject(item.located, item.located.error)

    def _claim(self, items: list[Item]) -> tuple[list[Item], EntityHolds | None, float]:
        """The claimed items, the entities the claim held, and when its round trip began
        (this process's monotonic clock): the holds' age, which a lane's first event's
        confirmation counts from (a pause between the claim and the lane counts)."""
        wanted = [item for item in items
                  if item.result is None and item.leader is None and item.routed]
        if not wanted:
            return [], None, 0.0
        claimed_at = self._monotonic()
        with self._around("claim", wanted) if self.middleware else _NOTHING:
            batch = self.mode.claim_batch(wanted)
        for item in wanted:
            item.claim = batch.taken.get(item.key)
            if item.claim is None:
                item.result = self.mode.not_taken(item, batch.records.get(item.key),
                                                  item.key in batch.refused)
        return [item for item in wanted if item.claim is not None], batch.holds, claimed_at

    def _handle(self, claimed: list[Item], holds: EntityHolds | None, claimed_at: float,
                alone: bool) -> None:
        if not claimed:
            return
        ordered = any(item.located is not None and item.located.order for item in claimed)
        owners = {item.key: item.claim.owner for item in claimed if item.claim is not None}
        # The claims are renewed from here on, so a wait for a busy entity
        # (``order_wait_seconds``) never outlasts them.
        with self.heartbeat.hold(owners) as leases:
            lanes = self.lanes.of(claimed, holds, claimed_at) if ordered else \
                [Lane([item]) for item in claimed]
            entities = {lane.entity_key: lane.owner for lane in lanes if lane.entity_key}
            # Unordered lanes hold no entity: nothing to keep (and nothing on a plain push).
            with self.heartbeat.holding(entities) if entities else _NO_HOLDS as held:
                # ``lane.confirmed`` stays when the hold was taken (``Lanes.of``): counted
                # from here, a pause since the claim would skip the first confirmation.
                for lane in lanes:
                    lane.hold = held.get(lane.entity_key)
                self._run_lanes(lanes, leases, alone)
            self._finish(claimed, [lane.release() for lane in lanes if lane.entity_key])

    def _run_lanes(self, lanes: list[Lane], leases: Mapping[str, Lease], alone: bool) -> None:
        # Lanes with an async handler go to the loop first, so they await while the
        # sync lanes run on this thread or the batch's threads; then both are waited for.
        # Plain loops, no comprehension: a push's walk pays nothing here (test_walk_budget).
        awaited: list[Lane] = []
        plain: list[Lane] = []
        for lane in lanes:
            for item in lane.items:
                route = item.located.route if item.located is not None else None
                if route is not None and route.is_async:
                    awaited.append(lane)
                    break
            else:
                plain.append(lane)
        done = self.handler_loop.start([self._run_lane_async(lane, leases) for lane in awaited]) \
            if awaited else None
        try:
            if len(plain) > 1 and self.concurrency > 1:
                list(self._threads().map(lambda lane: self._run_lane(lane, leases, alone), plain))
            else:
                for lane in plain:
                    self._run_lane(lane, leases, alone)
        finally:
            if done is not None:
                done.result()
                self._give_back_unrun(awaited)

    def _run_lane(self, lane: Lane, leases: Mapping[str, Lease], alone: bool) -> None:
        for index, item in enumerate(lane.items):
            # Before every event, the first too: a batch's lanes run one after the other
            # (or wait for a thread), so a lane's first event may start long after the
            # claim took its hold, behind another lane's handler the process was paused in.
            if lane.entity_key and not self._still_held(lane):
                self._give_rest_back(lane, index)
                return
            # An unordered lane asks nothing (a push's walk pays no call: test_walk_budget).
            if not (lane.entity_key and self._kept_stale(item, lane)):
                self._run(item, leases[item.key], alone, lane)

    async def _run_lane_async(self, lane: Lane, leases: Mapping[str, Lease]) -> None:
        # ``_run_lane`` on the loop: the same order, stale and hold rules; a sync handler
        # of a mixed lane (an entity's events of two types) runs in a thread.
        # Shutdown's cancellation may land at any await here (the hold's confirmation, a
        # slot, the handler, a sync handler's thread): the lane stops there, and
        # ``_give_back_unrun`` gives back each of its events left with no outcome.
        with contextlib.suppress(asyncio.CancelledError):
            for index, item in enumerate(lane.items):
                # Before every event, the first too (as ``_run_lane``); a confirmation is a
                # round trip, so it is asked in a thread.
                if lane.entity_key and not await _in_thread(self._still_held, lane):
                    self._give_rest_back(lane, index)
                    return
                if not (lane.entity_key and self._kept_stale(item, lane)) and \
                        not await self._run_async(item, leases[item.key], lane):
                    return  # shutdown cancelled its handler: it and the rest go back

    def _give_rest_back(self, lane: Lane, index: int) -> None:
        """The hold lapsed (a pause longer than the lease) before ``lane.items[index]``:
        another instance may hold the entity now, so that event and the rest go back busy."""
        for rest in lane.items[index:]:
            rest.pending = self.lanes.busy(rest)

    def _kept_stale(self, item: Item, lane: Lane) -> bool:
        """True when ``item`` of an ordered lane is older than its entity's applied position:
        its stale outcome is set instead of running it (both lane walks decide here)."""
        stale = self.mode.stale(item, lane)
        if stale is not None:
            item.pending = stale
        return stale is not None

    def _give_back_unrun(self, lanes: list[Lane]) -> None:
        """Give back each event of ``lanes`` that has no outcome: shutdown cancelled its lane
        before it ran (or its handler while it awaited); PENDING, the attempt not spent."""
        for lane in lanes:
            for item in lane.items:
                if item.pending is None and item.result is None:
                    item.pending = self._given_back(item)

    def _still_held(self, lane: Lane) -> bool:
        """True while the lane's hold holds: confirmed with the store (one round trip) when
        more than a quarter lease passed on this process's own clock since it last was."""
        if lane.hold is None or lane.hold.lost:
            return False
        at = self._monotonic()
        if at - lane.confirmed <= self.store.lease.total_seconds() / 4:
            return True
        lane.confirmed = at
        return self.heartbeat.confirm(lane.hold)

    def _finish(self, claimed: list[Item], releases: list[EntityRelease]) -> None:
        waiting = [item for item in claimed if item.result is None and item.leader is None
                   and item.pending is not None]
        if not waiting and not releases:
            return
        with self._around("finish", waiting) if self.middleware else _NOTHING:
            done = self.mode.store_finishes(waiting, releases)
        for entity_key in sorted(done.unreleased):
            # Its hold lapsed: the next holder reads this batch's keys as its orphan.
            logger.warning("hold on %s lapsed before its release; the next holder rolls its "
                           "events forward", entity_key)
        for item in waiting:
            pending = item.pending
            assert pending is not None
            if item.key in done.lost:
                item.result = _lease_lost(item)
            elif item.key in done.refused:
                item.result = self._refused_children(item)
            else:
                if pending.log is not None:
                    logger.log(*pending.log)
                item.result = pending.result

    def _relay(self, items: list[Item]) -> None:
        hook, relayed = self.after_success, self.mode.relayed
        sent = [item for item in items if hook is not None and item.leader is None
                and item.result is not None and item.result.outcome is Outcome.PROCESSED
                and item.pending is not None and relayed(item)]
        if hook is None or not sent:
            return
        # A hook that takes a batch (the inline relay's relay_many) gets it at once, to
        # publish the parents' children side by side rather than one after another.
        batch = hook if len(sent) > 1 and isinstance(hook, BatchAfterSuccess) else None
        with self._around("relay", sent) if self.middleware else _NOTHING:
            if batch is not None:
                try:
                    batch.relay_many([(item.key, relayed(item)) for item in sent
                                      if item.pending is not None])
                except Exception:  # as _run_hook: the batch is processed whatever happens
                    logger.exception("after_success hook failed for a batch of %d; left to "
                                     "the sweeper", len(sent))
                return
            for item in sent:
                if item.pending is not None:
                    _run_hook(hook, item.key, relayed(item))

    # -- one handler ------------------------------------------------------------------
    def _run(self, item: Item, lease: Lease, alone: bool, lane: Lane) -> None:
        assert item.claim is not None and item.located is not None
        if self._capped(item, lane):
            return
        route = item.located.route
        assert route is not None
        try:
            context = self.mode.context(item)
            # A delivery alone runs under its message's trace since ``run``; in a batch,
            # each handler adopts its own message's trace for its log lines. Written out,
            # not a helper: a push pays no call for it (test_walk_budget).
            scope: contextlib.AbstractContextManager[Mapping[str, str] | None] = \
                _NOTHING if alone and not self.middleware else self._scoped(item, alone)
            with scope as carried:
                returned = route.handler(context)
            # A plain handler returns None: no awaitable to look for (an ABC check).
            if returned is not None and inspect.isawaitable(returned):
                raise _unawaited(route.handler, returned)
        except Exception as exc:  # classified by the mode: unknown means transient
            self._failed(item, lane, exc)
            return
        self._ran(item, lease, lane, context, carried)

    async def _run_async(self, item: Item, lease: Lease, lane: Lane) -> bool:
        """``_run`` of an async handler, on the loop; False when shutdown cancelled it."""
        assert item.claim is not None and item.located is not None
        route = item.located.route
        assert route is not None
        if not route.is_async:  # a sync handler in an async lane: in a thread, as it is
            # Waited for even when shutdown cancels the lane: the batch must not release
            # the entity while its handler still runs (another instance would run a newer
            # event beside it). Its outcome stands; the rest of the lane goes back.
            await _in_thread(self._run, item, lease, False, lane)
            return True
        if self._capped(item, lane):
            return True
        task = asyncio.current_task()
        if task is not None:  # the watchdog names the handler that blocks the loop
            task.set_name(f"async handler {_name(route.handler)} of {item.key}")
        try:
            context = self.mode.context(item)
            async with self.handler_loop.slot():
                # Always scoped: the loop's task does not see the caller thread's trace.
                with self._scoped(item, alone=False) as carried:
                    await route.handler(context)  # type: ignore[misc]
        except asyncio.CancelledError:
            return False
        except Exception as exc:  # classified as a sync handler's
            self._failed(item, lane, exc)
            return True
        self._ran(item, lease, lane, context, carried)
        return True

    # The decisions both runs share (``_run``, ``_run_async``): they differ only where the
    # async one awaits (a slot of the loop, the handler) and in its trace scope.
    def _capped(self, item: Item, lane: Lane) -> bool:
        """True when the attempt cap refuses to run ``item`` (the mode's ``attempts_used``
        above ``max_attempts``): its failure is decided instead (``_failed``)."""
        route = item.located.route if item.located is not None else None
        if route is not None and route.max_age is not None and self.mode.honours_max_age:
            age = self._age(item)
            if age is not None and age > route.max_age:
                self._failed(item, lane, Expired(
                    f"{age:.0f} s after its publish time, past its route's max_age of "
                    f"{route.max_age:g} s: never run"))
                return True
        if self.mode.attempts_used(item) <= attempt_cap(item, self.settings):
            return False
        self._failed(item, lane, AttemptCapReached("attempt cap reached"))
        return True

    def _age(self, item: Item) -> float | None:
        """Seconds from the event's first publish time to the store's now (None: no time).

        A redriven message is stamped anew by Pub/Sub: its first publish time rides along
        as an attribute (``Delivery.first_published_at``), so a redrive never makes an
        event young again."""
        published = item.delivery.first_published_at()
        return None if published is None else (self.store.now() - published).total_seconds()

    def _failed(self, item: Item, lane: Lane, exc: Exception) -> None:
        """The run of ``item`` failed with ``exc`` (its handler's, its context's, the cap's):
        the mode's ``failure`` decides the outcome, then its ``undecided`` whether it stands."""
        mode = self.mode
        item.pending = mode.failure(item, exc)
        mode.undecided(item, lane)

    def _given_back(self, item: Item) -> Pending:
        # Shutdown cancelled its handler: the claim goes back untouched (the attempt
        # not spent), nacked or 503; the broker, or else the redrive, brings it back.
        assert item.claim is not None
        redrive_at = self.store.now() + timedelta(seconds=self.settings.redrive_after_seconds)
        return Pending(Finish(item.key, item.claim.owner, unclaim=True, redrive_at=redrive_at),
                       Result(Outcome.IN_PROGRESS, key=item.key, event_type=item.event_type,
                              attempt=item.claim.attempt - 1, error="Cancelled"),
                       (logging.WARNING, f"handler of {item.key} cancelled by shutdown; "
                                         "its event is given back"))

    def _ran(self, item: Item, lease: Lease, lane: Lane, context: Context,
             carried: Mapping[str, str] | None) -> None:
        """The handler returned: SUCCESS waits for the finish, unless the lease was lost."""
        if lease.lost:
            item.result = _lease_lost(item)
            return
        mode = self.mode
        item.pending = mode.success(item, context, carried,
                                    applied_fields(item) if lane.entity_key else None)
        if lane.entity_key and mode.moves_position:
            lane.applied(item)

    @contextlib.contextmanager
    def _scoped(self, item: Item, alone: bool) -> Iterator[Mapping[str, str] | None]:
        with contextlib.ExitStack() as stack:
            if not alone:
                stack.enter_context(tracecontext.adopted(
                    tracecontext.message_trace(item.delivery.attributes), item.request_id))
            carried: Mapping[str, str] | None = None
            for middleware in self.middleware:
                carried = stack.enter_context(middleware.handler(item)) or carried
            yield carried

    def _refused_children(self, item: Item) -> Result:
        # The store refused the children's content: a handler bug, FAILED for
        # good (the store wrote that in the same finish), acked.
        assert item.claim is not None
        logger.error("content on %s attempt %d: the store refused the children",
                     item.key, item.claim.attempt)
        return Result(Outcome.REJECTED, key=item.key, event_type=item.event_type,
                      attempt=item.claim.attempt, error=ContentRejected.__name__)

    # -- around the stages ------------------------------------------------------------
    # Called only with middleware: with none, the stages run bare (a push with
    # telemetry off makes no call here).
    def _observed(self, items: list[Item]) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        for middleware in self.middleware:
            stack.enter_context(middleware.batch(items))
        return stack

    def _around(self, stage: str, items: list[Item]) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        for middleware in self.middleware:
            stack.enter_context(middleware.stage(stage, items))
        return stack

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="eventbus-batch")
        return self._pool


async def _in_thread(call: Callable[..., _T], *args: Any) -> _T:
    """``asyncio.to_thread(call, *args)``, except that a cancellation waits for the thread
    to end before it is raised: a thread cannot be stopped, and what it does (a sync
    handler, a hold's confirmation) must be over before the lane's batch goes on."""
    context = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(context.run, call, *args))
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True  # shutdown's, maybe more than once: the thread runs on
    if cancelled:
        raise asyncio.CancelledError
    return future.result()


def _name(handler: Callable[..., Any]) -> str:
    return str(getattr(handler, "__qualname__", None) or type(handler).__qualname__)


def _unawaited(handler: Callable[..., Any], returned: Any) -> TypeError:
    # A sync function that returns a coroutine (a lambda around an async one) would
    # otherwise "succeed" without running it: a bug, retried until fixed.
    if inspect.iscoroutine(returned):
        returned.close()
    return TypeError(f"handler {_name(handler)} returned an awaitable it did not await: "
                     "declare it async def (or await inside it)")


def _undecided(item: Item) -> bool:
    """True while no stage has decided the item's result (nor follows another's)."""
    return item.result is None and item.leader is None


def _unavailable(error: str) -> Result:
    return Result(Outcome.UNAVAILABLE, error=error)


def _follow(result: Result) -> Result:
    """A second delivery of a key in one batch: acked as a duplicate, or nacked as the first."""
    return dataclasses.replace(result, outcome=Outcome.DUPLICATE) if result.outcome.acked \
        else result


def _lease_lost(item: Item) -> Result:
    # Another worker holds the record now and decides its outcome; answering
    # 503 lets the broker ask again instead of acking what this worker did.
    logger.warning("lease on %s was lost before the outcome was stored", item.key)
    return Result(Outcome.LEASE_LOST, key=item.key, event_type=item.event_type,
                  attempt=item.claim.attempt if item.claim else 0, error="LeaseLost")


def _run_hook(hook: AfterSuccess, key: str, outbox: Sequence[Mapping[str, Any]]) -> None:
    # SUCCESS is stored: whatever the hook does, the message is processed and
    # must be acked; the outbox keeps what the hook did not finish.
    try:
        hook(key, outbox)
    except Exception:
        logger.exception("after_success hook failed for %s; left to the sweeper", key)
