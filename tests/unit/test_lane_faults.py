"""Issue 39's faults in the ordered lane, each reproduced between two store calls or awaits.

* **Fault 1**: a pause between an ordered event's claim and its lane. The
  claim holds the entity; the instance is paused past the lease before its
  lane starts; another instance takes the lapsed entity and applies a newer
  position. The lane's first confirmation must count from when the hold was
  taken, so the paused instance asks the store and gives its event back
  rather than run an older position after a newer SUCCESS.
* **Fault 3**: shutdown's cancellation at an await of an async lane other
  than the handler's own. (a) On the hold confirmation between two events:
  the next event goes back PENDING, its attempt not spent (the guide's
  promise). (b) In a mixed lane, while the entity's sync handler runs in a
  thread: the entity stays held until the thread ends, so no other instance
  runs a newer event of it beside the older handler.
* **Issue 40's leak**: the handler loop's watchdog thread ends (joined) when the
  loop closes.

Each test runs on the memory store and on the local MongoDB-compatible server
(``mongo_uri``, ``mongo_db``), with fake clocks moved by hand: the store's
(``FakeClock`` on memory, ``Shift`` on MongoDB) and the instances' own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from eventbus.clock import Shift
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.order import entity_key
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.processor.handler_loop import HandlerLoop
from eventbus.processor.heartbeat import Heartbeat
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import BatchClaim, EntityTake
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock

LEASE = dt.timedelta(seconds=20)
ENTITY = {"partnerId": "p1", "entity_id": "order-7", "entity_type": "Order"}
ENTITY_KEY = entity_key("p1", "Order", "order-7")
WAIT = 5.0
"""Seconds a test waits for another thread at most (a loaded machine's slack, never spent)."""


class _Along(FakeClock):
    """An instance's ``FakeClock`` that moves the MongoDB store's ``Shift`` with it."""

    def __init__(self, start: dt.datetime, shift: Shift) -> None:
        super().__init__(start)
        self._shift = shift

    def advance(self, seconds: float) -> None:
        """Move this clock and the store's by ``seconds``."""
        super().advance(seconds)
        self._shift.advance(seconds)


@dataclasses.dataclass
class World:
    """One store and the clock every instance over it shares (it moves the store's too)."""

    store: Any
    clock: FakeClock

    def processor(self, routes: Router, store: Any = None, **settings: Any) -> Processor:
        """An instance over the store (or ``store``, a wrapper of it), on the world's clock.

        Its heartbeat renews only when asked (no thread beating on real time), so the
        holds and leases last what the world's clock says.
        """
        store = store or self.store
        return Processor(store, routes,
                         Settings(**{"max_attempts": 5, "order_wait_seconds": 0.2, **settings}),
                         self.clock, sleep=lambda seconds: None, monotonic=self.clock.monotonic,
                         heartbeat=Heartbeat(store, now=self.clock, background=False))

    def record(self, key: str) -> Mapping[str, Any]:
        """The stored record of the event delivered as ``key``."""
        return self.store.get(f"p:p1:{key}") or {}


@pytest.fixture(params=["memory", "mongo"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """The memory store, then the MongoDB one (a fresh database), each with a 20 s lease."""
    # Real time at the server's grain: MongoDB's TTL monitor must not delete the records.
    now = documents.bson_time(dt.datetime.now(dt.UTC))
    if request.param == "memory":
        clock = FakeClock(now)
        yield World(MemoryEventStore(lease=LEASE, clock=clock), clock)
        return
    from eventbus.store.mongo import MongoEventStore

    uri: str = request.getfixturevalue("mongo_uri")
    database = request.getfixturevalue("mongo_db")
    shift = Shift()
    store = MongoEventStore.from_settings(
        Settings(mongodb_uri=uri, mongodb_db=database.name,
                 lease_seconds=LEASE.total_seconds()), shift=shift)
    store.ensure_indexes()
    yield World(store, _Along(now, shift))
    store.close()


def delivery(event_type: str, position: int, key: str) -> Delivery:
    """An event of the one entity at ``position``, delivered under ``key``."""
    body = {"event_type": event_type, "event_version": "v1", "entity_metadata": ENTITY,
            "entity_data": {"ts": position}}
    return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=f"m-{key}")


class PausedAfterClaim:
    """The store, but the instance is paused right after its first claim returns:
    ``pause()`` runs there (the clock moves past the lease, another instance acts)."""

    def __init__(self, store: Any, pause: Any) -> None:
        self._store, self._pause = store, pause

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claim_many(self, fields: Mapping[str, Any], now: dt.datetime,
                   takes: Mapping[str, EntityTake] | None = None) -> BatchClaim:
        """The claim, then the pause (once)."""
        batch = self._store.claim_many(fields, now, takes)
        pause, self._pause = self._pause, None
        if pause is not None:
            pause()
        return batch


# -- fault 1 -------------------------------------------------------------------------------
def test_a_pause_between_the_claim_and_its_lane_never_runs_an_older_position(
        world: World) -> None:
    seen: list[int] = []
    routes = Router()

    @routes.handler("OR_MGMT", ordered_by="entity_data.ts")
    def project(context: Context) -> None:
        seen.append(context.event.entity_data["ts"])

    other = world.processor(routes)

    def pause() -> None:
        # Paused past the lease after the claim took the entity's hold; meanwhile another
        # instance takes the lapsed entity and applies position 6.
        world.clock.advance(3 * LEASE.total_seconds())
        assert other.process(delivery("OR_MGMT", 6, "newer")).outcome.value == "processed"

    paused = world.processor(routes, PausedAfterClaim(world.store, pause))
    result = paused.process(delivery("OR_MGMT", 4, "older"))
    assert seen == [6]  # position 4 never ran after 6's SUCCESS
    assert result.outcome.value in ("in_progress", "lease_lost")  # 503: it comes back
    entity = world.store.get(ENTITY_KEY) or {}
    assert entity.get("position") == 6
    # When it comes back, it is older than the applied position: stale, never run.
    assert other.process(delivery("OR_MGMT", 4, "older")).outcome.value == "stale"
    assert seen == [6]


# -- fault 3 -------------------------------------------------------------------------------
class HeldConfirmation:
    """The store, but its first hold confirmation (``renew_entities``) waits for ``answer``:
    shutdown can land on it. ``asked`` is set when it is waiting."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.asked, self.answer = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def renew_entities(self, holders: Mapping[str, str], now: dt.datetime) -> set[str]:
        """Wait for ``answer`` the first time, then renew."""
        if not self.asked.is_set():
            self.asked.set()
            assert self.answer.wait(WAIT)
        held: set[str] = self._store.renew_entities(holders, now)
        return held


def cancelled(processor: Processor) -> None:
    """Wait until shutdown's cancellation reached every lane of ``processor``'s loop
    (each one is cancelling or over)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if all(task.cancelling() for task in list(processor.handler_loop._tasks)):
            return
        time.sleep(0.005)
    raise AssertionError("the lanes were never cancelled")


def in_background(processor: Processor, deliveries: list[Delivery]) -> tuple[threading.Thread,
                                                                              list[Any]]:
    """Run ``deliveries`` as one batch of ``processor`` in a thread; its results fill the list."""
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.extend(processor.run(deliveries)))
    runner.start()
    return runner, results


def test_shutdown_on_the_hold_confirmation_gives_the_next_event_back_unspent(
        world: World) -> None:
    ran: list[int] = []
    routes = Router()

    @routes.handler("ASYNC", ordered_by="entity_data.ts")
    async def project(context: Context) -> None:
        ran.append(context.event.entity_data["ts"])
        # A slow handler: the next event's confirmation is a round trip (a quarter lease).
        world.clock.advance(LEASE.total_seconds() / 4 + 1)

    store = HeldConfirmation(world.store)
    processor = world.processor(routes, store)
    try:
        runner, results = in_background(processor, [delivery("ASYNC", 1, "first"),
                                                    delivery("ASYNC", 2, "second")])
        assert store.asked.wait(WAIT)  # the lane confirms its hold before event 2
        processor.stop(grace=0)  # shutdown lands on that await
        cancelled(processor)
        store.answer.set()
        runner.join(WAIT)
        assert not runner.is_alive()
    finally:
        store.answer.set()
        processor.close()
    assert ran == [1]
    assert [r.outcome.value for r in results] == ["processed", "in_progress"]
    assert world.record("second")["event_status"] == "PENDING"  # given back, as the guide says
    # The attempt was not spent: it comes back and runs as its first.
    again = world.processor(routes)
    try:
        assert again.process(delivery("ASYNC", 2, "second")).outcome.value == "processed"
    finally:
        again.close()
    assert ran == [1, 2]
    assert world.record("second")["attempts"] == 1


def test_shutdown_in_a_mixed_lane_keeps_the_entity_until_its_sync_handler_ends(
        world: World) -> None:
    running: list[int] = []
    overlaps: list[tuple[int, ...]] = []
    entered, leave = threading.Event(), threading.Event()
    routes = Router()

    def enter(position: int) -> None:
        if running:  # another handler of the entity still runs
            overlaps.append((*running, position))
        running.append(position)

    @routes.handler("ASYNC", ordered_by="entity_data.ts")
    async def project(context: Context) -> None:
        enter(context.event.entity_data["ts"])
        running.remove(context.event.entity_data["ts"])

    @routes.handler("SYNC", ordered_by="entity_data.ts")
    def slow(context: Context) -> None:  # the entity's next event, run in a thread
        enter(context.event.entity_data["ts"])
        entered.set()
        assert leave.wait(WAIT)
        running.remove(context.event.entity_data["ts"])

    first = world.processor(routes)
    other = world.processor(routes)
    try:
        runner, results = in_background(first, [delivery("ASYNC", 1, "one"),
                                                delivery("SYNC", 2, "two")])
        assert entered.wait(WAIT)
        first.stop(grace=0)  # shutdown while the sync handler runs in its thread
        cancelled(first)
        runner.join(0.5)  # on the old code, the batch released the entity by now
        # Another instance, given the entity's newer event meanwhile, must find it held.
        newer = other.process(delivery("ASYNC", 3, "three"))
        leave.set()
        runner.join(WAIT)
        assert not runner.is_alive()
    finally:
        leave.set()
        first.close()
    try:
        assert overlaps == []  # never two handlers of the entity at once
        assert newer.outcome.value == "in_progress"  # busy: it comes back
        # The sync handler ran to its end: its outcome stands.
        assert [r.outcome.value for r in results] == ["processed", "processed"]
        assert world.record("two")["event_status"] == "SUCCESS"
        assert other.process(delivery("ASYNC", 3, "three")).outcome.value == "processed"
        assert (world.store.get(ENTITY_KEY) or {}).get("position") == 3
    finally:
        other.close()


# -- issue 40: the watchdog ends with its loop ----------------------------------------------
def test_closing_the_handler_loop_ends_its_watchdog_and_every_thread_it_started() -> None:
    before = set(threading.enumerate())

    async def awaits() -> None:
        await asyncio.sleep(0)

    loop = HandlerLoop(block_warning=0.2)
    loop.run([awaits()])
    started = {thread.name for thread in set(threading.enumerate()) - before}
    assert "eventbus-async-watch" in started  # the watchdog runs while the loop does
    loop.close()
    # Joined by ``close``: nothing of the loop is left for a later test's log stream.
    assert [thread.name for thread in set(threading.enumerate()) - before
            if thread.is_alive()] == []
    loop.close()  # a second close has nothing left to do


def test_closing_a_processor_joins_its_heartbeat_and_handler_loop_threads() -> None:
    before = set(threading.enumerate())
    routes = Router()

    @routes.handler("ASYNC", ordered_by="entity_data.ts")
    async def project(context: Context) -> None:
        await asyncio.sleep(0)

    clock = FakeClock()
    processor = Processor(MemoryEventStore(lease=LEASE, clock=clock), routes,
                          Settings(async_block_warning_seconds=0.2), clock)
    assert processor.process(delivery("ASYNC", 1, "one")).outcome.value == "processed"
    started = {thread.name for thread in set(threading.enumerate()) - before}
    assert {"eventbus-heartbeat", "eventbus-async-watch"} <= started
    processor.close()
    assert [thread.name for thread in set(threading.enumerate()) - before
            if thread.is_alive()] == []
