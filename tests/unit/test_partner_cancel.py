"""Shutdown's cancellation after an async partner call answered never loses the answer.

Simulation seed 271 (issue 39): the cancellation landed on the partner wrapper's
bookkeeping (its breaker count, in a thread) after the partner had answered, the
guard stored a FAILED ``CancelledError`` and released its key, and the redelivery
called the partner again. One cancellation is absorbed there since fd934b7; a
second one (a shutdown's grace running out after its first cancel) broke out of
that wait and released the key the same way. Now every cancellation is absorbed
until the bookkeeping is done; the caller is cancelled at its next await, after
the guard has stored the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from eventbus.guard import Guard
from eventbus.model.status import Status
from eventbus.partners import Partner, Partners
from eventbus.processor.handler_loop import HandlerLoop
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore


@pytest.mark.parametrize("cancels", [1, 2, 5])
def test_cancels_during_the_bookkeeping_after_an_answer_keep_the_guards_result(
        cancels: int, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryEventStore()
    partner = Partners.beside(store, Settings()).get("acme")
    guard = Guard(store, lease=timedelta(seconds=60), now=store.now)
    entered, gate = threading.Event(), threading.Event()
    finish = Partner.finish

    def slow_finish(self: Partner, started: Any, exc: Exception | None) -> None:
        entered.set()
        gate.wait(10)
        finish(self, started, exc)

    monkeypatch.setattr(Partner, "finish", slow_finish)
    sent: list[int] = []

    async def notify() -> dict[str, Any]:
        sent.append(1)
        return {"accepted": "n-1"}

    async def handler() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await guard.run_async("g:notify", lambda: partner.call_async(notify))

    # The processor's own loop, cancelled as a shutdown cancels it (``cancel_after``), then
    # closed (its drain waits for the loop's thread jobs: the guard's SUCCESS write).
    loop = HandlerLoop()
    done = loop.start([handler()])
    assert entered.wait(10)
    for _ in range(cancels):  # the partner answered; its count is being stored
        loop.cancel_after(0.0)
        time.sleep(0.02)
    gate.set()
    done.result(timeout=10)
    loop.close()
    stored = store.guard_get("g:notify")
    assert stored is not None and stored["status"] == Status.SUCCESS, stored
    assert stored["result"] == {"accepted": "n-1"}
    assert sent == [1]
    # The redelivery finds the answer and calls nobody (on a loop of its own again: this
    # thread's may be taken by an earlier test's).
    again_loop = HandlerLoop()
    found: list[Any] = []

    async def redelivery() -> None:
        found.append(await guard.run_async("g:notify", lambda: partner.call_async(notify)))

    again_loop.run([redelivery()])
    again_loop.close()
    assert found[0].skipped and found[0].result == {"accepted": "n-1"} and sent == [1]
