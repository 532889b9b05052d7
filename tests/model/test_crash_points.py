"""Crash at every store call of one processing, recover on another instance, lose nothing.

For each scenario (a push whose handler emits a child, an ordered event, a
guarded partner call; and, since a parked event's counts are what a claim
may erase, a call parked before and a pull batch holding one), one
processing is run first to count the store calls it makes (the claim, the
guard's take and finish, the breaker's and the rate's reads, the finish, the
inline relay's marks...). Then, for every call ``i`` and both sides of it, a fresh
world runs the same processing on instance 0 with a crash armed there
(``tests.model.world.CrashingStore``: before ``i``, nothing of it is stored;
after it, it is stored and the process dies before going on). Instance 1
then recovers as the system would: the store's clock moves past the lease,
Pub/Sub redelivers the unacked messages to instance 1, and the world settles
(redrive and outbox sweeps, children delivered; ``World.settle``).

The ledger's promises are checked throughout (``tests.model.ledger``): the
guarded effect at most once (the one unfenceable case excepted: a crash
after the partner answered and before ``guard_finish`` stored it, which only
the partner's honouring of the forwarded key closes), the child published
and stored once, the entity's position never back, nothing lost. Every
failing crash point is reported, not only the first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.model.ledger import Violation
from tests.model.world import (
    LEASE_SECONDS,
    SETTINGS,
    Backend,
    MemoryBackend,
    Message,
    MongoBackend,
    World,
)

PAST_LEASE = 2 * round(LEASE_SECONDS / 2 + 1)
"""Even seconds just past one lease (the world's steps are even: see ``tests.model.world``)."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One processing to crash: ``build`` makes its batch (after any prelude of its own)."""

    name: str
    build: Callable[[World], list[Message]]
    recover: Callable[[World, list[Message]], None]
    """What reaches instance 1 after the crash (the redelivered batch, at least)."""


def _redeliver(world: World, batch: list[Message]) -> None:
    world.deliver(world.instances[1], batch)


def _child(world: World) -> list[Message]:
    world.new_call("fast", shared=False, emit=True, plan=[])
    return [world.messages[-1]]


def _guarded(world: World) -> list[Message]:
    world.new_call("fast", shared=False, emit=False, plan=[])
    return [world.messages[-1]]


def _ordered(world: World) -> list[Message]:
    # The entity is at position 1 already; the crashed event moves it to 3.
    world.new_order("e1", 1, plan=[])
    world.deliver(world.instances[1], [world.messages[-1]])
    world.new_order("e1", 3, plan=[])
    return [world.messages[-1]]


def _older_then_redelivered(world: World, batch: list[Message]) -> None:
    # An older event (2) arrives before the crashed one (3) is redelivered: it may run
    # (3 never succeeded) or be stale (3 did), never run after 3.
    world.new_order("e1", 2, plan=[])
    world.deliver(world.instances[1], [world.messages[-1]])
    _redeliver(world, batch)


def _parked_before(world: World, batch_of: int = 1) -> list[Message]:
    # The partner's one call of this window is spent: the event parks, and has parked
    # max_attempts - 1 times already (none of them an attempt).
    world.new_call("slow", shared=False, emit=False, plan=[])
    world.deliver(world.instances[1], [world.messages[-1]])
    world.new_call("slow", shared=False, emit=False, plan=[])
    parked = world.messages[-1]
    for _ in range(SETTINGS.max_attempts - 1):
        others = [world.add_call("fast") for _ in range(batch_of - 1)]
        world.deliver(world.instances[1], [parked, *others])
    return [parked, *[world.add_call("fast") for _ in range(batch_of - 1)]]


SCENARIOS = [Scenario("a push with a child", _child, _redeliver),
             Scenario("an ordered event", _ordered, _older_then_redelivered),
             Scenario("a guarded call", _guarded, _redeliver),
             Scenario("a parked call", _parked_before, _redeliver),
             Scenario("a pull batch with a parked call",
                      lambda world: _parked_before(world, batch_of=2), _redeliver)]


def calls_of(make: Callable[[], Backend], scenario: Scenario) -> list[str]:
    """The store calls instance 0 makes processing the scenario's message, uncrashed."""
    world = World(make(), [0.0, 0.0])
    try:
        batch = scenario.build(world)
        before = len(world.instances[0].store.calls)
        world.deliver(world.instances[0], batch)
        return world.instances[0].store.calls[before:]
    finally:
        world.close()


def crash_and_recover(make: Callable[[], Backend], scenario: Scenario, index: int,
                      when: str) -> str:
    """Crash at ``index`` (``before``/``after``), recover; return "" or what went wrong."""
    world = World(make(), [0.0, 0.0])
    try:
        batch = scenario.build(world)
        crashing = world.instances[0]
        crashing.store.arm(index, when)
        world.deliver(crashing, batch)
        if not crashing.dead:
            return "the crash point was never reached: the processing made fewer calls"
        world.advance(PAST_LEASE)
        scenario.recover(world, batch)
        world.check()
        world.settle()
    except Violation as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        world.close()
    return ""


def every_crash_point(make: Callable[[], Backend], scenario: Scenario) -> None:
    """Crash before and after each store call of one processing; fail listing every bad one."""
    calls = calls_of(make, scenario)
    assert "claim_many" in calls and "finish_many" in calls, calls  # the count saw the processing
    failures = [f"crash {when} call {index} ({name}): {problem}"
                for index, name in enumerate(calls) for when in ("before", "after")
                if (problem := crash_and_recover(make, scenario, index, when))]
    assert not failures, f"{scenario.name}, calls {calls}:\n" + "\n".join(failures)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_every_crash_point_recovers_on_the_memory_store(scenario: Scenario) -> None:
    every_crash_point(MemoryBackend, scenario)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_every_crash_point_recovers_on_mongodb(scenario: Scenario, mongo_client: MongoClient,
                                               mongo_db: Database) -> None:
    MongoBackend(mongo_client, mongo_db.name).store.ensure_indexes()
    every_crash_point(lambda: MongoBackend(mongo_client, mongo_db.name), scenario)
