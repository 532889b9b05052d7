"""``eventbus rebuild`` in replay mode on the in-memory store, through the real pipeline.

Events run live first (``LocalBus``); then a ``ReplayProcessor`` with another
router (the "fixed" code) runs them again through ``Rebuild``, and the bus
delivers whatever the rebuild's relay published.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.errors import ReplayRefused
from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.rebuild.mode import ReplayProcessor
from eventbus.rebuild.runner import Rebuild, Selection, StoredSource, new_run, run_order
from eventbus.settings import Settings
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import LocalBus
from tests.closing import closed_after_test
from tests.run_stores import runs_of

ENTITY = {"partnerId": "p1", "entity_id": "o-1", "entity_type": "Order"}


def entity(number: int) -> dict[str, str]:
    return {**ENTITY, "entity_id": f"o-{number}"}


class World:
    """A projection (``db``), partner calls counted, and the handlers' versions."""

    def __init__(self) -> None:
        self.db: dict[str, Any] = {}
        self.calls: list[str] = []
        self.seen: list[tuple[str, Any, bool]] = []

    def router(self, *, buggy: bool, children: int = 0, skip_notifier: bool = False) -> Router:
        routes = Router()

        @routes.handler("OR_MGMT")
        def on_order(context: Context) -> None:
            total = context.event.entity_data["total"]
            self.db[context.event.entity_metadata.entity_id] = total * (10 if buggy else 1)
            context.guard.run(context.key, lambda: self._call(context.key))
            for index in range(children):
                context.emit("OR_NOTE", {"n": index})

        @routes.handler("OR_NOTE", internal=True)
        def on_note(context: Context) -> None:
            self.seen.append(("note", context.key, context.replay is not None))

        @routes.handler("NOTIFY", replay="skip" if skip_notifier else "run")
        def on_notify(context: Context) -> None:
            self.seen.append(("notify", context.key, context.replay is not None))

        @routes.handler("POS_MGMT", ordered_by="entity_data.seq")
        def on_position(context: Context) -> None:
            self.seen.append(("pos", context.event.entity_data["seq"],
                              context.replay is not None))
            hook = self.during.get(context.event.entity_data["seq"])
            if hook is not None and context.replay is not None:
                hook()

        return routes

    during: dict[int, Callable[[], None]] = {}

    def _call(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        return {"status_code": 200}


def rebuild(bus: LocalBus, router: Router, *, query: EventQuery | None = None,
            keys: tuple[str, ...] = (), run: dict[str, Any] | None = None,
            stop_after: int | None = None, batch: int = 100,
            **flags: bool) -> tuple[Rebuild, Any]:
    selection = Selection(query or EventQuery(), keys)
    run = run or new_run(by="ops@example", why="bug 42", started=bus.clock(),
                         selection=selection, flags=flags)
    replay = Replay(run["rebuild_id"], "ops@example", "bug 42", bus.clock(),
                    new_calls=flags.get("new_calls", False),
                    emit_new=flags.get("emit_new", False), forward=flags.get("forward", False))
    processor = closed_after_test(ReplayProcessor(bus.store, router, bus.settings, bus.clock,
                                                  replay, after_success=bus.relay,
                                                  sleep=bus.clock.sleep,
                                                  monotonic=bus.clock.monotonic))
    job = Rebuild(runs_of(bus.store), processor, StoredSource(bus.store, selection), run,
                  batch=batch, sleep=bus.clock.sleep, monotonic=bus.clock.monotonic)
    report = job.run(stop_after=stop_after)
    bus.drain()
    return job, report


def test_a_rebuild_after_a_fixed_bug_rights_the_projection_and_calls_no_partner_again() -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(buggy=True)))
    keys = [bus.publish("OR_MGMT", {"total": n}, entity=entity(n)) for n in range(1, 6)]
    assert world.db == {f"o-{n}": n * 10 for n in range(1, 6)}  # the bug
    assert len(world.calls) == 5
    _, report = rebuild(bus, world.router(buggy=False), query=EventQuery(event_type="OR_MGMT"))
    assert world.db == {f"o-{n}": n for n in range(1, 6)}
    assert len(world.calls) == 5  # zero partner calls repeated
    assert report.counts["rebuilt"] == 5 and report.counts["failed"] == 0
    for key in keys:
        record = bus.record(key)
        assert record is not None and record["event_status"] == "SUCCESS"
        (entry,) = record["replays"]
        assert entry["by"] == "ops@example" and entry["why"] == "bug 42"
        assert entry["rebuild"] == report.rebuild_id and entry["outcome"] == "rebuilt"
        assert "rebuild_lease" not in record
    saved = runs_of(bus.store).rebuild_get(report.rebuild_id)
    assert saved is not None and saved["status"] == "finished"
    assert saved["counts"]["rebuilt"] == 5


def test_a_guarded_call_that_never_succeeded_is_refused_unless_allowed() -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(buggy=False)))
    key = bus.publish("OR_MGMT", {"total": 3}, entity=entity(3))
    bus.store.forget_guards()  # the first run's guard record lost: as if the call never ran
    _, report = rebuild(bus, world.router(buggy=False), keys=(key,))
    assert report.counts["failed"] == 1 and len(world.calls) == 1
    assert "--allow-new-calls" in report.failures[0]["reason"]
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    assert record["replays"][-1]["outcome"] == "failed"
    _, allowed = rebuild(bus, world.router(buggy=False), keys=(key,), new_calls=True)
    assert allowed.counts["rebuilt"] == 1 and len(world.calls) == 2


def test_a_partner_call_outside_the_guard_is_refused_in_replay_mode() -> None:
    routes, made = Router(), []

    @routes.handler("OR_MGMT")
    def handler(context: Context) -> None:
        made.append(context.partner("p1").call(lambda: "called"))

    bus = closed_after_test(LocalBus(routes))
    key = bus.publish("OR_MGMT", {"total": 1}, entity=entity(1))
    assert made == ["called"]
    _, report = rebuild(bus, routes, keys=(key,))
    assert made == ["called"] and report.counts["failed"] == 1
    assert "outside the guard" in report.failures[0]["reason"]
    record = bus.record(key)
    assert record is not None and record["replays"][0]["error"]["type"] == \
        ReplayRefused.__name__


def test_a_route_with_replay_skip_is_not_run() -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(buggy=False, skip_notifier=True)))
    key = bus.publish("NOTIFY", {"x": 1}, entity=entity(1))
    assert world.seen == [("notify", key, False)]
    _, report = rebuild(bus, world.router(buggy=False, skip_notifier=True),
                        query=EventQuery(event_type="NOTIFY"))
    assert world.seen == [("notify", key, False)]
    assert report.counts["skipped"] == 1 and "replay" in report.skipped[0]["reason"]
    _, ran = rebuild(bus, world.router(buggy=False), query=EventQuery(event_type="NOTIFY"))
    assert ran.counts["rebuilt"] == 1 and world.seen[-1] == ("notify", key, True)


def test_new_children_are_listed_then_published_once_with_emit_new() -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(buggy=False, children=1)))
    key = bus.publish("OR_MGMT", {"total": 2}, entity=entity(2))
    assert [s[0] for s in world.seen] == ["note"]
    fixed = world.router(buggy=False, children=3)  # the fixed code emits two more
    _, listed = rebuild(bus, fixed, keys=(key,))
    assert [c["key"] for c in listed.new_children] == [f"{key}/1:OR_NOTE", f"{key}/2:OR_NOTE"]
    assert not any(c["emitted"] for c in listed.new_children)
    assert [s[0] for s in world.seen] == ["note"]  # nothing published
    record = bus.record(key)
    assert record is not None and len(record["outbox"]) == 1
    assert record["replays"][0]["children"]["duplicates"] == 1
    _, emitted = rebuild(bus, fixed, keys=(key,), emit_new=True)
    assert all(c["emitted"] for c in emitted.new_children) and len(emitted.new_children) == 2
    assert [s[1] for s in world.seen] == [f"{key}/0:OR_NOTE", f"{key}/1:OR_NOTE",
                                          f"{key}/2:OR_NOTE"]
    assert all(not replayed for _, _, replayed in world.seen)  # the children run live
    _, again = rebuild(bus, fixed, keys=(key,), emit_new=True)
    assert again.new_children == [] and len(world.seen) == 3  # nothing more published
    record = bus.record(key)
    assert record is not None and len(record["outbox"]) == 3
    assert len(record["replays"]) == 3


def test_an_interrupted_rebuild_resumes_without_running_an_event_twice() -> None:
    world, runs = World(), []
    bus = closed_after_test(LocalBus(world.router(buggy=True)))
    for n in range(1, 8):
        bus.publish("OR_MGMT", {"total": n}, entity=entity(n))
    fixed = world.router(buggy=False)
    counting = Router()

    @counting.handler("OR_MGMT")
    def count(context: Context) -> None:
        runs.append(context.key)
        fixed.route_for(context.event).handler(context)

    first, report = rebuild(bus, counting, query=EventQuery(event_type="OR_MGMT"), batch=2,
                            stop_after=4)
    assert len(runs) == 4 and report.done == 4
    saved = runs_of(bus.store).rebuild_get(report.rebuild_id)
    assert saved is not None and saved["status"] == "interrupted"
    # A crash after the finish but before the checkpoint: the checkpoint lags a batch.
    saved["report"]["last_key"] = runs[1]
    saved["report"]["done"] = 2
    _, resumed = rebuild(bus, counting, query=EventQuery(event_type="OR_MGMT"), batch=2,
                         run=saved)
    assert sorted(runs) == sorted(set(runs)) and len(runs) == 7
    assert resumed.counts["already"] == 2 and resumed.counts["rebuilt"] == 7
    assert world.db == {f"o-{n}": n for n in range(1, 8)}
    assert first.report.rebuild_id == resumed.rebuild_id


def test_a_rebuild_against_live_deliveries_keeps_each_entitys_order() -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(buggy=False),
                                     settings=Settings(relay_inline=False,
                                                       order_wait_seconds=0.2)))
    for seq in (1, 2, 3):
        bus.publish("POS_MGMT", {"seq": seq}, entity=ENTITY)
    live: list[Any] = []
    # While the rebuild runs seq 2, a live seq 4 of the same entity arrives: it waits.
    World.during = {2: lambda: live.append(bus.publish("POS_MGMT", {"seq": 4},
                                                       entity=ENTITY))}
    try:
        _, report = rebuild(bus, world.router(buggy=False),
                            query=EventQuery(event_type="POS_MGMT"))
    finally:
        World.during = {}
    assert report.counts["rebuilt"] == 3
    assert [s[1:] for s in world.seen] == [(1, False), (2, False), (3, False), (1, True),
                                           (2, True), (3, True)]
    entity_records = [r for r in bus.store._events.values() if r.get("position") is not None]
    assert [r["position"] for r in entity_records] == [3]  # never moved backwards
    assert bus.redeliver(live[0]).outcome.value == "processed"
    assert world.seen[-1][1:] == (4, False)


def test_the_run_order_groups_an_entitys_events_by_position() -> None:
    rows = [{"idempotency_key": "a", "created": "0003"},
            {"idempotency_key": "x2", "created": "0001", "order": {"entity_key": "e",
                                                                   "position": 2}},
            {"idempotency_key": "x1", "created": "0004", "order": {"entity_key": "e",
                                                                   "position": 1}},
            {"idempotency_key": "b", "created": "0002"}]
    assert run_order(rows) == ["x1", "x2", "b", "a"]


def test_a_route_refuses_an_unknown_replay_policy() -> None:
    with pytest.raises(ValueError, match="replay must be"):
        Router().handler("X", replay="never")  # type: ignore[arg-type]
