"""The stateful model: instances with skewed clocks, crashes and freezes, over one store.

A hypothesis ``RuleBasedStateMachine`` drives two or three processor
instances (``tests.model.world``), each with its own clock offset, over one
store, through random steps: new events (guarded partner calls, ordered
events of two entities, now and then one whose upcaster raises), deliveries
of any of them in batches of one to three (duplicates and reorderings
included), hung handlers released later, the store's clock moved, an
instance's clock jumping, an instance frozen and resumed, a crash armed at
any later store call of an instance (before or after it) and a restart,
redrive and outbox sweeps, and operator replays. Breaker openings and parks
come from the plans (transient failures) and the shared rate. After every
step the ledger's promises are checked (``tests.model.ledger``); at the end
the world settles and nothing may be lost.

Runs against the in-memory store always and against the real server
(``MongoEventStore``, its clock moved by a ``Shift``); under ``CI=true`` a
missing server fails, never skips (``tests/conftest.py``).

Profiles (``EVENTBUS_MODEL_PROFILE``):

* ``ci`` (the default; ``make test`` and CI): a fixed, derandomized budget, the
  same examples every run (memory 300 examples of up to 30 steps, MongoDB 40);
* ``long``: many more random examples (memory 3000 of up to 60 steps,
  MongoDB 400), failures kept in hypothesis's example database::

      EVENTBUS_MODEL_PROFILE=long python -m pytest tests/model/test_model.py -n 0

* ``check``: the default under ``make check`` (``EVENTBUS_TIER=check``): as ``ci``,
  60 examples on memory (the MongoDB half needs a server: not in the quick tier).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pymongo import MongoClient
from pymongo.database import Database

from tests.model.world import (
    BEHAVIOURS,
    OFFSETS,
    PARTNERS,
    Backend,
    Instance,
    MemoryBackend,
    Message,
    MongoBackend,
    World,
)

PROFILE = os.environ.get("EVENTBUS_MODEL_PROFILE") or (
    "check" if os.environ.get("EVENTBUS_TIER") == "check" else "ci")
_BUDGETS = {  # (examples on memory, on MongoDB, steps per example)
    "ci": (300, 40, 30),
    "long": (3000, 400, 60),
    # make check: a fifth of ci's examples on memory, derandomized as in ci. All 300 took
    # 11 s of CPU (34 s on a loaded 2-core machine), the longest test of the quick tier;
    # make test and CI run the 300 (and MongoDB's 40, a server test, never in check).
    "check": (60, 40, 30),
}
if PROFILE not in _BUDGETS:
    raise ValueError(f"EVENTBUS_MODEL_PROFILE must be one of {sorted(_BUDGETS)}, not {PROFILE!r}")


def budget(store: str) -> settings:
    """The hypothesis settings of the model on ``store`` (``memory`` or ``mongo``) for PROFILE."""
    memory, mongo, steps = _BUDGETS[PROFILE]
    fixed = PROFILE in ("ci", "check")
    # ci: the same examples every run, nothing kept; long: found failures kept and replayed
    # first next time, in hypothesis's example database (.hypothesis/).
    kept: dict[str, Any] = {"database": None} if fixed else {}
    return settings(max_examples=memory if store == "memory" else mongo,
                    stateful_step_count=steps, deadline=None, derandomize=fixed,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much], **kept)


SLOT = st.integers(0, 2)
_WEIGHTED = ("pass", "hang", "transient", "hang", "permanent")
"""The world's behaviours, hangs twice as likely: most interleavings need one."""
assert set(_WEIGHTED) == set(BEHAVIOURS)
PLANS = st.lists(st.sampled_from(_WEIGHTED), max_size=3)
ADVANCES = st.sampled_from([2, 10, 22, 32, 44, 62, 130, 640])
"""Even seconds (see ``tests.model.world``): around a lease, a window, a redrive, minutes."""


def _pick(instances: list[Instance], slot: int) -> Instance:
    return instances[slot % len(instances)]


def _recent(world: World, pick: int) -> Message:
    """The ``pick``-th newest message: a redelivery of what was just sent is the likely one."""
    return world.messages[-1 - pick % len(world.messages)]


class Model(RuleBasedStateMachine):
    """Random steps over a ``World``; the ledger's promises checked after every one."""

    make_backend: ClassVar[Callable[[], Backend]] = MemoryBackend

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.busy = False
        """Set while a step or a check runs: still set at teardown means one raised."""

    def _w(self) -> World:
        assert self.world is not None
        self.busy = True
        self.world.step()
        return self.world

    def _done(self) -> None:
        self.busy = False

    @initialize(offsets=st.lists(st.sampled_from(OFFSETS), min_size=2, max_size=3))
    def start(self, offsets: list[float]) -> None:
        self.world = World(type(self).make_backend(), offsets)

    # -- events ----------------------------------------------------------------------
    @rule(partner=st.sampled_from(PARTNERS), shared=st.booleans(), emit=st.booleans(),
          plan=PLANS)
    def new_call(self, partner: str, shared: bool, emit: bool, plan: list[str]) -> None:
        self._w().new_call(partner, shared=shared, emit=emit, plan=plan)
        self._done()

    @rule(entity=st.sampled_from(("e1", "e2")), seq=st.integers(1, 6), plan=PLANS,
          call=st.booleans(), unreadable=st.integers(0, 9).map(lambda n: n == 9))
    def new_order(self, entity: str, seq: int, plan: list[str], call: bool,
                  unreadable: bool) -> None:
        self._w().new_order(entity, seq, plan=plan, call=call, unreadable=unreadable)
        self._done()

    # -- deliveries and hangs --------------------------------------------------------
    @precondition(lambda self: self.world is not None and bool(self.world.messages)
                  and bool(self.world.eligible()))
    @rule(slot=SLOT, picks=st.lists(st.integers(0, 63), min_size=1, max_size=3))
    def deliver(self, slot: int, picks: list[int]) -> None:
        world = self._w()
        world.deliver(_pick(world.eligible(), slot), [_recent(world, pick) for pick in picks])
        self._done()

    @precondition(lambda self: self.world is not None and bool(self.world.messages)
                  and bool(self.world.eligible()))
    @rule(first=SLOT, second=SLOT, pick=st.integers(0, 63))
    def duplicate(self, first: int, second: int, pick: int) -> None:
        # Pub/Sub pushes a message twice, to two instances, the second while the first runs.
        world = self._w()
        message = _recent(world, pick)
        world.deliver(_pick(world.eligible(), first), [message])
        if world.eligible():
            world.deliver(_pick(world.eligible(), second), [message])
        self._done()

    @precondition(lambda self: self.world is not None
                  and any(not h.run.instance.frozen for h in self.world.hangs))
    @rule(pick=st.integers(0, 7))
    def release(self, pick: int) -> None:
        world = self._w()
        hangs = [hang for hang in world.hangs if not hang.run.instance.frozen]
        world.release(hangs[pick % len(hangs)])
        self._done()

    # -- time --------------------------------------------------------------------------
    @rule(seconds=ADVANCES)
    def advance(self, seconds: int) -> None:
        self._w().advance(seconds)
        self._done()

    @rule(slot=SLOT, offset=st.sampled_from(OFFSETS))
    def jump(self, slot: int, offset: float) -> None:
        world = self._w()
        _pick(world.instances, slot).clock.offset = offset
        self._done()

    @precondition(lambda self: self.world is not None and bool(self.world.eligible()))
    @rule(slot=SLOT, seconds=st.sampled_from([0, 24, 44, 130]))
    def freeze(self, slot: int, seconds: int) -> None:
        # A GC pause or a stopped VM: no heartbeat while the store's clock moves on (past
        # its leases, mostly), until ``thaw`` lets it go on with its writes.
        world = self._w()
        world.freeze(_pick(world.eligible(), slot))
        world.advance(seconds)
        self._done()

    @precondition(lambda self: self.world is not None
                  and any(i.frozen for i in self.world.instances))
    @rule(slot=SLOT)
    def thaw(self, slot: int) -> None:
        world = self._w()
        _pick([i for i in world.instances if i.frozen], slot).frozen = False
        self._done()

    # -- crashes -----------------------------------------------------------------------
    @precondition(lambda self: self.world is not None and bool(self.world.eligible()))
    @rule(slot=SLOT, calls=st.integers(0, 8), when=st.sampled_from(("before", "after")))
    def crash(self, slot: int, calls: int, when: str) -> None:
        world = self._w()
        _pick(world.eligible(), slot).store.arm(calls, when)
        self._done()

    @precondition(lambda self: self.world is not None
                  and any(i.dead for i in self.world.instances))
    @rule(slot=SLOT)
    def restart(self, slot: int) -> None:
        world = self._w()
        world.restart(_pick([i for i in world.instances if i.dead], slot))
        self._done()

    # -- sweeps and operators ------------------------------------------------------------
    @precondition(lambda self: self.world is not None and bool(self.world.eligible()))
    @rule(slot=SLOT)
    def redrive(self, slot: int) -> None:
        world = self._w()
        world.redrive(_pick(world.eligible(), slot))
        self._done()

    @precondition(lambda self: self.world is not None and bool(self.world.eligible()))
    @rule(slot=SLOT)
    def relay(self, slot: int) -> None:
        world = self._w()
        world.relay_sweep(_pick(world.eligible(), slot))
        self._done()

    @precondition(lambda self: self.world is not None and bool(self.world.eligible()))
    @rule(slot=SLOT, pick=st.integers(0, 15))
    def replay(self, slot: int, pick: int) -> None:
        world = self._w()
        failed = [record for record in world.store.get_many(world.keys())
                  if record.get("event_status") == "FAILED"]
        if failed:
            world.replay(_pick(world.eligible(), slot), failed[pick % len(failed)])
        self._done()

    # -- what must be true ---------------------------------------------------------------
    @invariant()
    def promises_hold(self) -> None:
        if self.world is not None:
            self.busy = True
            self.world.check()
            self.busy = False

    def teardown(self) -> None:
        if self.world is None:
            return
        try:
            if not self.busy:  # a step that raised already failed the example
                self.busy = True
                self.world.step()
                self.world.settle()
                self.busy = False
        finally:
            self.world.close()


def test_the_promises_hold_on_the_memory_store() -> None:
    run_state_machine_as_test(Model, settings=budget("memory"))


@pytest.fixture()
def model_database(mongo_client: MongoClient, mongo_db: Database) -> Any:
    """The test's database, its indexes made once; each example empties its collections."""
    MongoBackend(mongo_client, mongo_db.name).store.ensure_indexes()
    return mongo_db


def test_the_promises_hold_on_mongodb(mongo_client: MongoClient, model_database: Database) -> None:
    class MongoModel(Model):
        make_backend = staticmethod(lambda: MongoBackend(mongo_client, model_database.name))

    run_state_machine_as_test(MongoModel, settings=budget("mongo"))
