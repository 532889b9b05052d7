"""The processor's guard waits on the processor's own clocks, not the wall clock.

A guarded effect's SUCCESS write that meets ``StoreUnavailable`` is retried
with backoff (``Guard._store_success``). The processor hands the guard the
``sleep`` and ``monotonic`` it was given, as it does to its lanes and partners,
so the retries wait on a test's fake clock (and the simulation's virtual time)
instead of sleeping for real; a rebuild's guard likewise.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from eventbus.model.context import Context
from eventbus.model.errors import StoreUnavailable
from eventbus.model.router import Router
from eventbus.testing import LocalBus
from tests.rebuild_support import ENTITY, job, local_bus


class FailingSuccessWrites:
    """``guard_finish(succeeded=True)`` meets a failover ``fails`` times, then lands."""

    def __init__(self, store: Any, fails: int) -> None:
        self._store, self.fails = store, fails

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def guard_finish(self, key: str, owner: str, now: datetime, *, succeeded: bool,
                     result: dict[str, Any]) -> bool:
        if succeeded and self.fails > 0:
            self.fails -= 1
            raise StoreUnavailable("primary stepped down")
        done: bool = self._store.guard_finish(key, owner, now, succeeded=succeeded,
                                              result=result)
        return done


def _router(calls: list[str]) -> Router:
    routes = Router()

    @routes.handler("OR_MGMT")
    def notify(context: Context) -> None:
        context.guard.run(f"g:{context.key}", lambda: calls.append(context.key) or {"ok": 1})

    return routes


def test_a_pushs_success_write_retries_wait_on_the_processors_clock() -> None:
    calls: list[str] = []
    bus: LocalBus = local_bus(_router(calls))
    bus.processor.guard.store = FailingSuccessWrites(bus.store, fails=3)
    started_fake, started_real = bus.clock.monotonic(), time.monotonic()
    key = bus.publish("OR_MGMT", {"n": 1}, entity=ENTITY)
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS" and calls == [key]
    # Three failed writes: waits of 0.05, 0.1 and 0.2 s, all on the fake clock.
    assert abs(bus.clock.monotonic() - started_fake - 0.35) < 1e-6
    assert time.monotonic() - started_real < 5.0


def test_a_rebuilds_guard_waits_on_the_same_clocks_as_the_processor() -> None:
    bus = local_bus(_router([]))
    rebuild = job(bus, _router([]))
    assert rebuild.processor.guard.sleep == bus.clock.sleep
    assert rebuild.processor.guard.monotonic == bus.clock.monotonic
