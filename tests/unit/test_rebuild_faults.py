"""Issue 39: a rebuild never rewinds an ordered entity (fault 2), and a resumed rebuild
finishes what its run left (the unlisted ``--resume`` fault).

On the in-memory store with a fake clock. A crash is a ``BaseException`` raised by a
wrapped store call, after its write: the process dies between two store writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.router import Router
from eventbus.testing import LocalBus
from tests.rebuild_support import ENTITY, LEASE, Crash, audits, crashing, job, local_bus
from tests.run_stores import runs_of


class World:
    """The partner app's projection of each order, and every handler run."""

    def __init__(self) -> None:
        self.projection: dict[str, str] = {}
        self.runs: list[tuple[str, bool]] = []

    def router(self, fails: Callable[[Context], BaseException | None] = lambda context: None,
               ) -> Router:
        """The ordered ``OR_MGMT`` handler; ``fails(context)``: the error it raises, if any."""
        routes = Router()

        @routes.handler("OR_MGMT", ordered_by="entity_data.n")
        def on_order(context: Context) -> None:
            self.runs.append((context.key, context.replay is not None))
            error = fails(context)
            if error is not None:
                raise error
            entity_id = context.event.entity_metadata.entity_id
            self.projection[entity_id] = str(context.event.entity_data["status"])

        return routes

    def replayed(self, key: str) -> int:
        return sum(1 for k, replay in self.runs if k == key and replay)


def make_bus(world: World) -> LocalBus:
    return local_bus(world.router())


def publish(bus: LocalBus, n: int, status: str, entity_id: str = "o-1") -> str:
    return bus.publish("OR_MGMT", {"n": n, "status": status},
                       entity={**ENTITY, "entity_id": entity_id})


def entity_position(bus: LocalBus, key: str) -> Any:
    record = bus.record(key)
    assert record is not None
    entity = bus.store.get(str(record["order"]["entity_key"]))
    assert entity is not None
    return entity["position"]


# -- fault 2: a window's older event never rewinds its entity --------------------------------
def test_a_window_holding_only_an_older_event_leaves_the_entity_on_its_applied_state() -> None:
    """OPERATORS.md's ``--since BAD --until FIX``: event 1 inside, event 2 after the fix."""
    world = World()
    bus = make_bus(world)
    placed = publish(bus, 1, "OR_PLC")
    delivered = publish(bus, 2, "OR_DLV")
    assert world.projection == {"o-1": "OR_DLV"} and entity_position(bus, placed) == 2
    report = job(bus, world.router(), keys=(placed,)).run()
    assert world.replayed(placed) == 0  # never run: it would rewind the projection
    assert world.projection == {"o-1": "OR_DLV"} and entity_position(bus, placed) == 2
    assert report.counts["stale"] == 1 and report.counts["rebuilt"] == 0
    assert [s["key"] for s in report.skipped] == [placed]
    (entry,) = audits(bus, placed, report.rebuild_id)
    assert entry["outcome"] == "stale" and entry["stale"]["applied_position"] == 2
    assert world.replayed(delivered) == 0


def test_an_older_event_runs_when_the_rebuild_re_runs_the_applied_one_after_it() -> None:
    world = World()
    bus = make_bus(world)
    keys = [publish(bus, 1, "OR_PLC"), publish(bus, 2, "OR_DLV")]
    report = job(bus, world.router(), keys=tuple(keys)).run()
    assert [k for k, replay in world.runs if replay] == keys  # both, in position order
    assert world.projection == {"o-1": "OR_DLV"} and report.counts["rebuilt"] == 2
    assert report.counts["stale"] == 0


def test_an_entity_split_across_batches_never_ends_on_an_older_state() -> None:
    """Batch 1 holds event 1 alone: the applied event 2 is not in its lane, so it is stale."""
    world = World()
    bus = make_bus(world)
    keys = [publish(bus, 1, "OR_PLC"), publish(bus, 2, "OR_DLV")]
    report = job(bus, world.router(), keys=tuple(keys), batch=1).run()
    assert world.replayed(keys[0]) == 0 and world.replayed(keys[1]) == 1
    assert world.projection == {"o-1": "OR_DLV"}
    assert report.counts == {**report.counts, "stale": 1, "rebuilt": 1}


# -- the unlisted fault: --resume skips what its run left unfinished -------------------------
def test_a_resumed_rebuild_finishes_the_events_a_crash_left_leased() -> None:
    """The first run dies between its claim (rebuild leases written) and its finish. A resume
    at once meets the dead run's live leases: busy. Before the fix that resume's checkpoint
    passed them (``last_key`` at the end, ``finished``), so a later ``--resume`` ran nothing
    and the three selected events were never rebuilt."""
    world = World()
    bus = make_bus(world)
    keys = [publish(bus, 1, "OR_PLC", f"o-{n}") for n in range(1, 4)]
    first = job(bus, world.router())
    undo = crashing(bus.store, "rebuild_claim_many")
    with pytest.raises(Crash):
        first.run()
    undo()
    rebuild_id = first.report.rebuild_id
    saved = runs_of(bus.store).rebuild_get(rebuild_id)
    early = job(bus, world.router(), run=saved, retries=1).run()
    assert early.counts["busy"] == 3 and all(world.replayed(k) == 0 for k in keys)
    bus.clock.advance(LEASE + 1)  # the dead run's leases lapse
    late = job(bus, world.router(), run=runs_of(bus.store).rebuild_get(rebuild_id)).run()
    assert all(world.replayed(k) == 1 for k in keys)  # each once, none skipped
    assert all(len(audits(bus, k, rebuild_id)) == 1 for k in keys)
    assert late.counts["rebuilt"] == 3 and late.counts["busy"] == 0
    saved = runs_of(bus.store).rebuild_get(rebuild_id)
    assert saved is not None and saved["report"]["unfinished"] == []
    again = job(bus, world.router(), run=saved).run()  # a further resume runs nothing twice
    assert all(world.replayed(k) == 1 for k in keys) and again.counts["rebuilt"] == 3


def test_a_resume_runs_an_event_its_run_passed_while_the_entity_was_busy() -> None:
    """A batch's event left busy (its entity held) is behind the checkpoint once the
    next batch is done; the resume runs it, once."""
    world = World()
    bus = make_bus(world)
    keys = [publish(bus, 1, "OR_PLC", f"o-{n}") for n in range(1, 3)]
    first = job(bus, world.router(), batch=1, retries=0)
    undo = crashing(bus.store, "rebuild_claim_many")
    with pytest.raises(Crash):
        first.run()  # batch 1's claim leased keys[0]; the process died
    undo()
    saved = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
    second = job(bus, world.router(), run=saved, batch=1, retries=0)
    report = second.run()
    assert report.counts["busy"] == 1 and world.replayed(keys[1]) == 1
    saved = runs_of(bus.store).rebuild_get(report.rebuild_id)
    assert saved is not None and saved["report"]["last_key"] == keys[1]
    assert saved["report"]["unfinished"] == [keys[0]]
    bus.clock.advance(LEASE + 1)
    job(bus, world.router(), run=saved, batch=1).run()
    assert world.replayed(keys[0]) == 1 and world.replayed(keys[1]) == 1


# -- the applied event's re-run fails for now: its entity is not left on an older state -------
def test_an_applied_event_failing_for_now_runs_again_so_the_entity_ends_on_its_state() -> None:
    """Seed 1595 of tests/sim (issue 39): one batch re-runs event 1 then the applied event 2,
    whose handler meets the store away (transient). Before the fix event 2 was audited failed,
    so no run of this rebuild ran it again, and the projection stayed on event 1 (OR_PLC)
    under position 2. Now it is given back (busy) and run again: OR_DLV."""
    from eventbus.model.errors import StoreUnavailable

    world = World()
    failing = {"left": 1}

    def fails(context: Context) -> BaseException | None:
        if context.replay is None or context.event.entity_data["n"] != 2 or not failing["left"]:
            return None
        failing["left"] -= 1
        return StoreUnavailable("the store is away (test)")

    routes = world.router(fails)
    bus = local_bus(routes)
    keys = [publish(bus, 1, "OR_PLC"), publish(bus, 2, "OR_DLV")]
    report = job(bus, routes, keys=tuple(keys)).run()
    assert world.projection == {"o-1": "OR_DLV"} and entity_position(bus, keys[0]) == 2
    assert report.counts["rebuilt"] == 2 and report.counts["failed"] == 0
    assert [entry["outcome"] for entry in audits(bus, keys[1], report.rebuild_id)] == ["rebuilt"]


def test_an_applied_event_still_failing_is_left_for_the_resume() -> None:
    """Failing for the run's every try, it is listed unfinished (busy, no audit entry): the
    resume runs it, and the entity ends on its state."""
    from eventbus.model.errors import StoreUnavailable

    world = World()
    failing = {"on": True}
    routes = world.router(lambda context: StoreUnavailable("the store is away (test)")
                          if context.replay is not None and context.event.entity_data["n"] == 2
                          and failing["on"] else None)
    bus = local_bus(routes)
    keys = [publish(bus, 1, "OR_PLC"), publish(bus, 2, "OR_DLV")]
    report = job(bus, routes, keys=tuple(keys), retries=1).run()
    assert report.unfinished == [keys[1]] and audits(bus, keys[1], report.rebuild_id) == []
    failing["on"] = False
    job(bus, routes, run=runs_of(bus.store).rebuild_get(report.rebuild_id)).run()
    assert world.projection == {"o-1": "OR_DLV"}
    assert [entry["outcome"] for entry in audits(bus, keys[1], report.rebuild_id)] == ["rebuilt"]


# -- seed 80: a resume runs the first run's plan, not a query's answer now --------------------
def test_a_resume_runs_the_first_plan_though_an_older_event_of_an_entity_finished_since() -> None:
    """Seed 80 of tests/sim (issue 39). Entity B's event 3 arrived first and failed for now;
    the first run planned A1 A2 B1 B2 and stopped after A2 (the checkpoint). Event 3 then
    succeeded: planned again, B's group starts at event 3's arrival, before A's, so every B
    key stood before the checkpoint and the resume ran nothing. Now the first plan is kept:
    the resume decides B1 and B2 (stale: the applied event 3 is not in the rebuild)."""
    world = World()
    failing = {"left": 1}

    def fails(context: Context) -> BaseException | None:
        if context.event.entity_data["n"] != 3 or not failing["left"]:
            return None
        failing["left"] -= 1
        return ConnectionError("the partner is away (test)")

    routes = world.router(fails)
    bus = local_bus(routes)
    later = publish(bus, 3, "OR_DLV", "o-B")
    bus.clock.advance(1)
    firsts = [publish(bus, n, status, "o-A") for n, status in ((1, "OR_PLC"), (2, "OR_DLV"))]
    bus.clock.advance(1)
    seconds = [publish(bus, n, status, "o-B") for n, status in ((1, "OR_PLC"), (2, "OR_SHP"))]
    first = job(bus, routes, batch=1)
    interrupted = first.run(stop_after=2)
    assert interrupted.last_key == firsts[1]
    stale_before = interrupted.counts["stale"]  # A1 alone in its batch: A2 is applied
    assert bus.redeliver(later).outcome.value == "processed"  # event 3 succeeds now
    rebuild_id = first.report.rebuild_id
    resumed = job(bus, routes, run=runs_of(bus.store).rebuild_get(rebuild_id), batch=1).run()
    assert [entry["outcome"] for key in seconds for entry in audits(bus, key, rebuild_id)] == \
        ["stale", "stale"]
    assert resumed.counts["stale"] == stale_before + 2 and audits(bus, later, rebuild_id) == []
    assert world.projection == {"o-A": "OR_DLV", "o-B": "OR_DLV"}
    assert runs_of(bus.store).rebuild_plan(rebuild_id) == [*firsts, *seconds]


def test_a_resume_over_the_stored_plan_still_names_a_given_key_with_no_record() -> None:
    """``--keys`` naming a key the store lacks: the first run says so, and a resume (which
    reads its stored plan, not the store) says so again, and exits 1 for it."""
    world = World()
    bus = make_bus(world)
    known = publish(bus, 1, "OR_PLC")
    first = job(bus, world.router(), keys=(known, "p:p1:nobody:OR_MGMT:0"))
    first.run(stop_after=0)
    assert first.source.missing == ["p:p1:nobody:OR_MGMT:0"]
    resumed = job(bus, world.router(), run=runs_of(bus.store).rebuild_get(first.report.rebuild_id))
    resumed.run()
    assert resumed.source.missing == ["p:p1:nobody:OR_MGMT:0"]
    assert world.replayed(known) == 1
