"""Issue 39's "async shutdown and late pushes" fault: a push that arrives after close.

``Processor.close()`` closes its handler loop. A push still in flight at the
web layer (or a pull batch handed over late) then reaches the processor with
an async handler to run. It used to reach ``run_coroutine_threadsafe`` on the
closed loop and raise ``RuntimeError: Event loop is closed`` out of
``Processor.process`` (a 500). The guide's shutdown promise holds instead: the
event is given back (PENDING, the attempt not spent, answered IN_PROGRESS:
nacked or 503) and its handler never runs on a loop that is going away; no
new loop (nor thread) is started after close either.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta

import pytest

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.processor.handler_loop import HandlerLoop
from eventbus.processor.heartbeat import Heartbeat
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.web.http_status import STATUS

LEASE = timedelta(seconds=20)


def _delivery(event_type: str, key: str, position: int | None = None) -> Delivery:
    body = {"event_type": event_type, "event_version": "v1",
            "entity_metadata": {"partnerId": "p1", "entity_id": "order-7",
                                "entity_type": "Order"},
            "entity_data": {"ts": position or 0}}
    return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=f"m-{key}")


def _processor(ran: list[str]) -> tuple[Processor, MemoryEventStore]:
    routes = Router()

    @routes.handler("ASYNC")
    async def plain(context: Context) -> None:
        await asyncio.sleep(0)
        ran.append(context.key)

    @routes.handler("ORDA", ordered_by="entity_data.ts")
    async def ordered(context: Context) -> None:
        await asyncio.sleep(0)
        ran.append(context.key)

    clock = FakeClock()
    store = MemoryEventStore(lease=LEASE, clock=clock)
    processor = Processor(store, routes, Settings(max_attempts=3), clock,
                          sleep=lambda seconds: None, monotonic=clock.monotonic,
                          heartbeat=Heartbeat(store, now=clock, background=False))
    return processor, store


@pytest.mark.parametrize("warmed", [True, False], ids=["loop-closed", "never-started"])
@pytest.mark.parametrize("event_type", ["ASYNC", "ORDA"])
def test_a_push_after_close_is_given_back_not_an_error(warmed: bool, event_type: str) -> None:
    ran: list[str] = []
    processor, store = _processor(ran)
    if warmed:  # the loop ran a handler, then close() ended it
        first = processor.process(_delivery(event_type, "first", 1))
        assert first.outcome is Outcome.PROCESSED
    processor.close(0.0)
    before = set(threading.enumerate())

    late = processor.process(_delivery(event_type, "late", 2))

    assert late.outcome is Outcome.IN_PROGRESS, late
    assert STATUS[late.outcome] == 503
    record = store.get("p:p1:late") or {}
    assert record.get("event_status") == "PENDING", record
    assert not record.get("attempts"), record  # the attempt not spent
    assert "p:p1:late" not in ran
    # Nothing started after close: no new loop, no new thread.
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


def test_a_closed_handler_loop_cancels_what_it_is_given() -> None:
    loop = HandlerLoop(block_warning=0.0)
    ran: list[str] = []

    async def work(name: str) -> None:
        ran.append(name)

    loop.run([work("before")])
    loop.close()
    late = work("after")
    loop.start([late]).result(timeout=5.0)  # done at once: never a closed loop's error
    assert ran == ["before"]
    assert late.cr_frame is None  # closed, so never "never awaited"
