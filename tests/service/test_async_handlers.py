"""``async def`` handlers on the pull worker, on push (the Flask app) and in LocalBus.

The processor awaits them on its own event loop (``HandlerLoop``); the tests
count how many await at once (``most_in_flight``) rather than time them, and
check what the store holds afterwards: the same outcomes as sync handlers,
given back (not lost) when shutdown cancels them, correct (with a warning)
when one blocks the loop by mistake.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from eventbus import create_app
from eventbus.model.context import Context
from eventbus.model.errors import PermanentError
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock, LocalBus, push_body
from eventbus.workers.pull import Inbox, PullWorker
from tests.closing import closed_after_test
from tests.service.test_pull_worker import ENTITY, FakeMessage, message

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
AsyncBehaviour = Callable[[Context], Awaitable[None]]


@dataclasses.dataclass
class Worker:
    store: MemoryEventStore
    worker: PullWorker
    processor: Processor
    ran: list[str]


def worker(behaviour: AsyncBehaviour, *, settings: Settings | None = None,
           sync_types: tuple[str, ...] = (), ordered: bool = False) -> Worker:
    """A pull worker whose TEST handler is ``async def`` (and sync ``sync_types``)."""
    routes, ran = Router(), []

    @routes.handler("TEST", ordered_by="entity_data.n" if ordered else None)
    async def handle(context: Context) -> None:
        ran.append(context.key)
        await behaviour(context)

    for event_type in sync_types:
        @routes.handler(event_type)
        def plain(context: Context) -> None:
            ran.append(context.key)

    clock = FakeClock(NOW)
    store = MemoryEventStore(lease=dt.timedelta(seconds=30), clock=clock)
    processor = Processor(store, routes, settings or Settings(max_attempts=5), clock)
    pull = PullWorker(processor, Inbox(), subscription="projects/p/subscriptions/s-pull",
                      batch_size=100)
    return Worker(store, pull, processor, ran)


def status(store: MemoryEventStore, key: str) -> str:
    return str((store.get(key) or {}).get("event_status"))


def test_a_batch_of_async_handlers_awaits_side_by_side() -> None:
    async def partner(context: Context) -> None:
        await asyncio.sleep(0.2)  # a partner answering in 200 ms

    w = worker(partner)
    batch = [message(n) for n in range(40)]
    started = time.monotonic()
    results = w.worker.run_batch(batch)
    took = time.monotonic() - started
    try:
        assert [m.answer for m in batch] == ["ack"] * 40
        assert {r.outcome.value for r in results} == {"processed"}
        assert all(status(w.store, r.key) == "SUCCESS" for r in results)
        # Every handler of the batch awaited at once: one thread would take 8 s.
        assert w.processor.handler_loop.most_in_flight == 40
        assert took < 2.0, took
    finally:
        w.processor.close()


def test_the_cap_holds_however_large_the_batch() -> None:
    async def partner(context: Context) -> None:
        await asyncio.sleep(0.05)

    w = worker(partner, settings=Settings(max_attempts=5, async_concurrency=7))
    batch = [message(n) for n in range(30)]
    try:
        w.worker.run_batch(batch)
        assert [m.answer for m in batch] == ["ack"] * 30
        assert w.processor.handler_loop.most_in_flight == 7
    finally:
        w.processor.close()


def test_async_failures_are_classified_as_sync_ones() -> None:
    async def behaviour(context: Context) -> None:
        await asyncio.sleep(0)
        n = context.event.entity_data["n"]
        if n == 2:
            raise ConnectionError("partner down")  # transient: nacked, retryable
        if n == 3:
            raise PermanentError("no such order")  # FAILED for good, acked
        if n == 4:
            context.emit("CHILD", {"of": n})

    w = worker(behaviour)
    batch = [message(1), message(2), message(3), message(4)]
    try:
        results = w.worker.run_batch(batch)
        assert [m.answer for m in batch] == ["ack", "nack", "ack", "ack"]
        assert [r.outcome.value for r in results] == ["processed", "retry", "rejected",
                                                       "processed"]
        failed = w.store.get(results[1].key) or {}
        assert failed["retryable"] is True
        assert failed["error"]["type"] == "ConnectionError"
        assert (w.store.get(results[2].key) or {})["error"]["classification"] == "permanent"
        assert len((w.store.get(results[3].key) or {})["outbox"]) == 1
    finally:
        w.processor.close()


def test_a_batch_mixing_sync_and_async_handlers() -> None:
    async def behaviour(context: Context) -> None:
        await asyncio.sleep(0.05)

    w = worker(behaviour, sync_types=("PLAIN",))
    batch = [message(1), message(2, "PLAIN"), message(3), message(4, "PLAIN")]
    try:
        results = w.worker.run_batch(batch)
        assert [m.answer for m in batch] == ["ack"] * 4
        assert sorted(w.ran) == sorted(r.key for r in results)
        assert all(status(w.store, r.key) == "SUCCESS" for r in results)
        assert w.processor.handler_loop.most_in_flight == 2  # only the async ones awaited
    finally:
        w.processor.close()


def test_shutdown_cancels_an_awaiting_handler_and_its_event_comes_back() -> None:
    entered, calls = threading.Event(), []

    async def hangs(context: Context) -> None:
        calls.append(context.key)
        if len(calls) == 1:
            entered.set()
            await asyncio.Event().wait()  # a partner that never answers

    w = worker(hangs)
    batch = [message(1)]
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(w.worker.run_batch(batch)))
    runner.start()
    assert entered.wait(5)
    w.processor.stop(grace=0)  # what the worker's stop() does, without the grace period
    runner.join(5)
    assert not runner.is_alive()
    (result,) = done[0]
    assert batch[0].answer == "nack"
    assert result.outcome.value == "in_progress"
    record = w.store.get(result.key) or {}
    assert record["event_status"] == "PENDING"  # given back, not FAILED, not lost
    # It comes back: redelivered, it runs and succeeds (its attempt was not spent).
    again = message(1)
    assert w.worker.run_batch([again])[0].outcome.value == "processed"
    assert again.answer == "ack"
    assert status(w.store, result.key) == "SUCCESS"
    assert (w.store.get(result.key) or {})["attempts"] == 1
    w.processor.close()


def test_close_gives_back_a_handler_still_awaiting_after_the_grace() -> None:
    entered = threading.Event()

    async def hangs(context: Context) -> None:
        entered.set()
        await asyncio.sleep(30)

    w = worker(hangs)
    batch = [message(1), message(2)]
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(w.worker.run_batch(batch)))
    runner.start()
    assert entered.wait(5)
    started = time.monotonic()
    w.processor.close(grace=0.2)
    runner.join(5)
    assert time.monotonic() - started < 5
    assert [m.answer for m in batch] == ["nack", "nack"]
    assert {status(w.store, r.key) for r in done[0]} == {"PENDING"}


def test_a_handler_that_blocks_the_loop_is_named_and_still_correct(
        caplog: pytest.LogCaptureFixture) -> None:
    async def blocks(context: Context) -> None:
        if context.event.entity_data["n"] == 1:
            # The mistake: a sync wait inside async def; long enough that a watchdog thread
            # starved on a loaded machine still wakes while it lasts.
            time.sleep(1.5)
        await asyncio.sleep(0)

    w = worker(blocks, settings=Settings(max_attempts=5, async_block_warning_seconds=0.2))
    batch = [message(1), message(2)]
    # On the logger itself: a service test earlier in this process may have configured the
    # library's logging (logs.configure), which stops "eventbus" records reaching the root.
    watched = logging.getLogger("eventbus.async")
    watched.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING, logger="eventbus.async"):
        try:
            results = w.worker.run_batch(batch)
        finally:
            w.processor.close()
            watched.removeHandler(caplog.handler)
    assert [m.answer for m in batch] == ["ack", "ack"]
    assert all(status(w.store, r.key) == "SUCCESS" for r in results)
    warned = [r.getMessage() for r in caplog.records if r.name == "eventbus.async"]
    assert any("has blocked the event loop" in line and "handle" in line
               and results[0].key in line for line in warned), warned


def test_an_entitys_events_run_in_order_one_at_a_time_while_entities_overlap() -> None:
    running: dict[str, int] = {}
    seen: list[tuple[str, int]] = []
    overlaps: list[str] = []

    async def ordered(context: Context) -> None:
        entity = context.event.entity_metadata.entity_id
        running[entity] = running.get(entity, 0) + 1
        if running[entity] > 1:
            overlaps.append(entity)
        seen.append((entity, context.event.entity_data["n"]))
        await asyncio.sleep(0.02)
        running[entity] -= 1

    w = worker(ordered, ordered=True)

    def of(entity: str, n: int) -> FakeMessage:
        body = {"event_type": "TEST", "event_version": "v1",
                "entity_metadata": {**ENTITY, "entity_id": entity}, "entity_data": {"n": n}}
        return FakeMessage(json.dumps(body).encode(), {"idempotency_key": f"{entity}-{n}"},
                           f"m-{entity}-{n}")

    batch = [of(entity, n) for n in (3, 1, 2) for entity in ("a", "b", "c")]
    try:
        w.worker.run_batch(batch)
    finally:
        w.processor.close()
    assert [m.answer for m in batch] == ["ack"] * 9
    assert overlaps == []
    for entity in ("a", "b", "c"):
        assert [n for e, n in seen if e == entity] == [1, 2, 3]
    assert w.processor.handler_loop.most_in_flight == 3  # one per entity at a time


def test_a_sync_function_returning_a_coroutine_fails_instead_of_succeeding_unrun() -> None:
    routes = Router()

    async def real(context: Context) -> None:
        context.emit("CHILD", {})

    routes.handler("TEST")(lambda context: real(context))  # type: ignore[arg-type,return-value]
    bus = closed_after_test(LocalBus(routes))
    key = bus.publish("TEST", {}, entity=ENTITY)
    record = bus.record(key) or {}
    assert record["event_status"] == "FAILED"
    assert "did not await" in record["error"]["message"]


def test_localbus_runs_async_handlers_and_their_cascades() -> None:
    routes, order = Router(), []

    @routes.handler("PARENT")
    async def parent(context: Context) -> None:
        await asyncio.sleep(0.01)
        context.emit("CHILD", {"step": 1})
        order.append("parent")

    @routes.handler("CHILD")
    async def child(context: Context) -> None:
        await asyncio.sleep(0)
        if context.attempt == 1:
            raise ConnectionError("partner down")
        order.append("child")

    bus = LocalBus(routes)
    try:
        key = bus.publish("PARENT", {}, entity=ENTITY)
        assert (bus.record(key) or {})["event_status"] == "SUCCESS"
        retried = [r for r in bus.results if r.outcome.value == "retry"]
        assert len(retried) == 1  # the child's first attempt, classified transient
        assert bus.redeliver(retried[0].key).outcome.value == "processed"
        assert order == ["parent", "child"]
    finally:
        bus.close()


def test_push_answers_an_async_handler_as_a_sync_one() -> None:
    routes = Router()

    @routes.handler("TEST")
    async def handle(context: Context) -> None:
        await asyncio.sleep(0.01)
        if context.event.entity_data.get("fail"):
            raise ConnectionError("partner down")

    store = MemoryEventStore(lease=dt.timedelta(seconds=30), clock=FakeClock(NOW))
    app = create_app(routes, Settings(relay_inline=False), store, now=FakeClock(NOW))
    client = app.test_client()

    def body(n: int, **data: Any) -> dict[str, Any]:
        event = {"event_type": "TEST", "event_version": "v1", "entity_metadata": ENTITY,
                 "entity_data": {"n": n, **data}}
        return push_body(json.dumps(event).encode(), {"idempotency_key": f"k-{n}"})

    try:
        ok, failing = client.post("/", json=body(1)), client.post("/", json=body(2, fail=True))
        assert (ok.status_code, ok.get_json()["outcome"]) == (200, "processed")
        assert (failing.status_code, failing.get_json()["outcome"]) == (503, "retry")
        assert (store.get(ok.get_json()["idempotency_key"]) or {})["event_status"] == "SUCCESS"
        assert (store.get(failing.get_json()["idempotency_key"]) or {})["retryable"] is True
    finally:
        app.extensions["eventbus"].processor.close()


def test_a_rebuild_runs_async_handlers_with_the_async_guard_and_refused_partner_calls() -> None:
    from eventbus.model.errors import ReplayRefused
    from eventbus.store.operator_queries import EventQuery
    from tests.service.test_rebuild import rebuild

    calls, db = [], {}

    def router(factor: int, outside_guard: bool = False) -> Router:
        routes = Router()

        @routes.handler("OR_MGMT")
        async def on_order(context: Context) -> None:
            await asyncio.sleep(0)
            db[context.event.entity_metadata.entity_id] = context.event.entity_data["n"] * factor

            async def call() -> dict[str, int]:
                calls.append(context.key)
                return {"status_code": 200}

            await context.guard.run_async(context.key, call)
            if outside_guard:
                await context.partner("acme").call_async(call)

        return routes

    with LocalBus(router(10)) as bus:
        keys = [bus.publish("OR_MGMT", {"n": n}, entity={**ENTITY, "entity_id": f"o-{n}"})
                for n in range(1, 4)]
        assert db == {"o-1": 10, "o-2": 20, "o-3": 30} and len(calls) == 3
        _, report = rebuild(bus, router(1), query=EventQuery(event_type="OR_MGMT"))
        assert db == {"o-1": 1, "o-2": 2, "o-3": 3}  # the fixed code ran, awaited
        assert len(calls) == 3  # the async guard returned the stored results: no new call
        assert report.counts["rebuilt"] == 3
        _, refused = rebuild(bus, router(1, outside_guard=True), keys=(keys[0],))
        assert refused.counts["failed"] == 1 and len(calls) == 3
        assert ReplayRefused.__name__ in str((bus.record(keys[0]) or {}).get("replays"))
