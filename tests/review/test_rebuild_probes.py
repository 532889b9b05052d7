"""Review probes of issue 31's promise: a rebuild never calls a partner twice, never loses
the earlier SUCCESS, never moves an entity's position backwards, and an interrupted rebuild
never runs an event twice.

Each probe attacks one way the promise could break (two rebuilds at once, live deliveries
of the same keys, a process frozen past its lease, a crash between two store writes, a
handler outside the guard, hostile selections, ``verify`` with a handler that reaches out).
Most run on the in-memory store with a fake clock (leases and freezes by hand); the ones
marked ``mongo`` run on the real server.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.rebuild.mode import ReplayProcessor
from eventbus.rebuild.runner import (
    Rebuild,
    Report,
    Selection,
    StoredSource,
    new_run,
)
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import LocalBus
from tests.rebuild_support import ENTITY, LEASE, Crash, audits, crashing, job, local_bus
from tests.run_stores import runs_of


class World:
    """A projection, partner calls counted, handler runs counted, hooks run during a replay."""

    def __init__(self) -> None:
        self.db: dict[str, Any] = {}
        self.calls: list[str] = []
        self.runs: list[tuple[str, bool]] = []
        self.during: dict[str, Callable[[Context], None]] = {}
        self.in_effect: Callable[[str], None] | None = None

    def router(self, *, ordered: bool = False, direct: bool = False) -> Router:
        routes = Router()
        options: dict[str, Any] = {"ordered_by": "entity_data.n"} if ordered else {}

        @routes.handler("OR_MGMT", **options)
        def on_order(context: Context) -> None:
            self.runs.append((context.key, context.replay is not None))
            self.db[context.event.entity_metadata.entity_id] = context.event.entity_data["n"]
            hook = self.during.get(context.key)
            if hook is not None and context.replay is not None:
                hook(context)
            if direct:
                context.partner("p1").call(lambda: self._call(context.key))
            else:
                context.guard.run(f"call:{context.key}", lambda: self._call(context.key))

        return routes

    def _call(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        if self.in_effect is not None:
            self.in_effect(key)
        return {"status_code": 200}

    def ran(self, key: str, replay: bool = True) -> int:
        return sum(1 for k, r in self.runs if k == key and r == replay)


def entity(number: int) -> dict[str, str]:
    return {**ENTITY, "entity_id": f"o-{number}"}


def make_bus(world: World, *, ordered: bool = False, direct: bool = False,
             lease: float = LEASE) -> LocalBus:
    return local_bus(world.router(ordered=ordered, direct=direct), lease=lease)


def published(bus: LocalBus, count: int, **options: Any) -> list[str]:
    return [bus.publish("OR_MGMT", {"n": n}, entity=entity(n), **options)
            for n in range(1, count + 1)]


# -- two rebuilds at once -------------------------------------------------------------------
def test_a_second_rebuild_of_a_leased_record_waits_and_never_runs_it_meanwhile() -> None:
    """Rebuild B starts while rebuild A holds a record: B must not run it under A's lease."""
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    a, b = job(bus, world.router()), job(bus, world.router(), retries=0)
    seen: list[Report] = []
    world.during[key] = lambda context: seen.append(b.run()) if not seen else None
    report_a = a.run()
    (report_b,) = seen
    assert report_b.counts["busy"] == 1 and report_b.counts["rebuilt"] == 0
    assert report_a.counts["rebuilt"] == 1
    assert world.ran(key) == 1 and world.calls == [key]  # the live call only
    assert bus.record(key)["event_status"] == "SUCCESS"  # type: ignore[index]
    assert [e["rebuild"] for e in audits(bus, key)] == [a.report.rebuild_id]


def test_two_processes_resuming_the_same_rebuild_run_each_event_once() -> None:
    """``--resume rb-x`` started twice at once (threads, the store's lock between them)."""
    world = World()
    bus = make_bus(world)
    keys = published(bus, 30)
    first = job(bus, world.router())
    run = dict(first.run_document)
    runs_of(bus.store).rebuild_save(run)
    jobs = [job(bus, world.router(), run=dict(run)) for _ in range(2)]
    for one in jobs:
        one.batch = 3
    threads = [threading.Thread(target=one.run) for one in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    rebuild_id = str(run["rebuild_id"])
    assert all(world.ran(key) == 1 for key in keys), world.runs
    assert all(len(audits(bus, key, rebuild_id)) == 1 for key in keys)
    assert len(world.calls) == len(keys)  # the live calls, none repeated


# -- live duplicates and redrives of the same keys --------------------------------------------
def test_live_duplicates_and_redrives_during_a_rebuild_run_nothing() -> None:
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    results = []

    def live(context: Context) -> None:
        results.append(bus.redeliver(key))  # Pub/Sub redelivers the same message now
        from eventbus.workers.redrive import Redriver
        results.append(Redriver(bus.store, bus.publisher, bus.settings, now=bus.clock,
                                locate=bus.processor.locate).sweep())

    world.during[key] = live
    report = job(bus, world.router()).run()
    assert results[0].outcome.value == "duplicate" and results[1].republished == 0
    assert world.ran(key, replay=False) == 1 and world.ran(key) == 1
    assert world.calls == [key] and report.counts["rebuilt"] == 1
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    assert "rebuild_lease" not in record


# -- frozen past the lease -----------------------------------------------------------------
def test_a_rebuild_frozen_past_its_lease_loses_its_finish_and_calls_no_partner() -> None:
    """A freezes inside the handler past its lease; B (the same rebuild resumed) runs the
    event; A's late finish is fenced: one audit entry, no partner call repeated."""
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    a = job(bus, world.router())
    runs_of(bus.store).rebuild_save(a.run_document)
    b = job(bus, world.router(), run=dict(a.run_document))
    later: list[Report] = []
    frozen: list[bool] = []

    def freeze(context: Context) -> None:
        if not frozen:
            frozen.append(True)
            bus.clock.advance(LEASE * 3)  # frozen: the lease lapsed, renewals stopped
            later.append(b.run())

    world.during[key] = freeze
    report_a = a.run()
    assert later[0].counts["rebuilt"] == 1
    # A's finish was fenced (lease lost); its retry finds B's audit entry: "already".
    assert report_a.counts["rebuilt"] == 0 and report_a.counts["already"] == 1, report_a
    assert world.ran(key) == 2  # the handler did run twice: inherent to a lease
    assert world.calls == [key]
    assert len(audits(bus, key, a.report.rebuild_id)) == 1
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    assert "rebuild_lease" not in record


def test_an_ordered_rebuild_frozen_past_its_hold_never_moves_the_position_back() -> None:
    """The rebuild holds entity o-1 (positions 1..3); it freezes past its hold, a live event
    at position 4 takes the entity and applies; the rebuild's late release must not win."""
    world = World()
    bus = make_bus(world, ordered=True)
    keys = [bus.publish("OR_MGMT", {"n": n}, entity=ENTITY) for n in (1, 2, 3)]
    entity_key = _entity_key(bus, keys[0])
    assert bus.store.get(entity_key)["position"] == 3  # type: ignore[index]
    newer: list[str] = []

    def freeze(context: Context) -> None:
        bus.clock.advance(LEASE * 3)
        newer.append(bus.publish("OR_MGMT", {"n": 4}, entity=ENTITY))

    world.during[keys[0]] = freeze
    job(bus, world.router(ordered=True)).run()
    stored = bus.store.get(entity_key)
    assert stored is not None and stored["position"] == 4
    assert stored["applied_key"] == newer[0]
    assert all(bus.record(k)["event_status"] == "SUCCESS" for k in keys)  # type: ignore[index]
    # The live event ran once, and is not stale.
    assert world.ran(newer[0], replay=False) == 1
    assert not (bus.record(newer[0]) or {}).get("stale")


def test_a_live_event_of_a_held_entity_waits_and_the_position_only_moves_forward() -> None:
    world = World()
    bus = make_bus(world, ordered=True)
    keys = [bus.publish("OR_MGMT", {"n": n}, entity=ENTITY) for n in (1, 2, 3)]
    entity_key = _entity_key(bus, keys[0])
    live: list[Any] = []

    def arrive(context: Context) -> None:
        event_key = bus.publish("OR_MGMT", {"n": 4}, entity=ENTITY)
        live.append(bus.record(event_key))

    world.during[keys[1]] = arrive
    report = job(bus, world.router(ordered=True)).run()
    assert report.counts["rebuilt"] == 3
    assert live[0]["event_status"] != "SUCCESS"  # it waited for the rebuild's hold
    assert [n for k, r in world.runs if r for n in [k]] == keys  # in position order
    stored = bus.store.get(entity_key)
    assert stored is not None and stored["position"] == 3
    bus.clock.advance(bus.settings.redrive_after_seconds + 1)
    from eventbus.workers.redrive import Redriver
    Redriver(bus.store, bus.publisher, bus.settings, now=bus.clock,
             locate=bus.processor.locate).sweep()
    bus.drain()
    stored = bus.store.get(entity_key)
    assert stored is not None and stored["position"] == 4


def _entity_key(bus: LocalBus, key: str) -> str:
    record = bus.record(key)
    assert record is not None
    return str(record["order"]["entity_key"])


# -- a crash between two store writes of a batch ------------------------------------------------
def test_a_crash_right_after_the_rebuild_claim_runs_each_event_once_on_resume() -> None:
    world = World()
    bus = make_bus(world)
    keys = published(bus, 3)
    first = job(bus, world.router())
    undo = crashing(bus.store, "rebuild_claim_many")
    with pytest.raises(Crash):
        first.run()
    undo()
    assert all(world.ran(key) == 0 for key in keys)
    run = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
    assert run is not None and run["status"] == "running"
    # Resumed at once: the dead process's leases still hold; nothing runs, all listed busy.
    early = job(bus, world.router(), run=dict(run), retries=1).run()
    assert early.counts["busy"] == 3 and all(world.ran(key) == 0 for key in keys)
    # After the lease: every event runs exactly once, and no partner call again.
    bus.clock.advance(LEASE + 1)
    again = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
    assert again is not None
    again["report"] = {**again["report"], "last_key": ""}  # a lagging checkpoint
    late = job(bus, world.router(), run=again).run()
    assert late.counts["rebuilt"] == 3
    assert all(world.ran(key) == 1 for key in keys) and len(world.calls) == 3
    assert all(len(audits(bus, key, first.report.rebuild_id)) == 1 for key in keys)


def test_a_crash_after_a_new_guarded_call_never_repeats_the_call_on_resume() -> None:
    """--allow-new-calls: the call is made and stored; the process dies before the finish."""
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    bus.store.forget_guards()  # type: ignore[attr-defined]  # the call's record expired
    first = job(bus, world.router(), new_calls=True)
    undo = crashing(bus.store, "rebuild_finish_many", after=False)
    with pytest.raises(Crash):
        first.run()
    undo()
    assert world.calls == [key, key]  # the live one, and the allowed new one
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    assert audits(bus, key) == []
    bus.clock.advance(LEASE + 1)
    run = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
    report = job(bus, world.router(), run=run, new_calls=True).run()
    assert report.counts["rebuilt"] == 1
    assert world.calls == [key, key]  # the guard's stored result, not a third call
    assert len(audits(bus, key, first.report.rebuild_id)) == 1


def test_a_crash_after_the_finish_before_the_checkpoint_runs_nothing_again() -> None:
    world = World()
    bus = make_bus(world)
    keys = published(bus, 4)
    first = job(bus, world.router())
    first.batch = 2
    undo = crashing(first.runs, "rebuild_save", after=False,
                    when=lambda run: run.get("status") == "finished")
    with pytest.raises(Crash):
        first.run()
    undo()
    assert all(world.ran(key) == 1 for key in keys)
    run = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
    assert run is not None and run["report"]["last_key"] == ""  # the checkpoint lagged
    report = job(bus, world.router(), run=run).run()
    assert report.counts["already"] == 4 and report.counts["rebuilt"] == 0
    assert all(world.ran(key) == 1 for key in keys) and len(world.calls) == 4


# -- a handler outside the guard, a guard whose stored result is FAILED --------------------------
def test_a_partner_call_outside_the_guard_is_refused_and_the_success_kept() -> None:
    world = World()
    bus = make_bus(world, direct=True)
    (key,) = published(bus, 1)
    report = job(bus, world.router(direct=True)).run()
    assert world.calls == [key] and report.counts["failed"] == 1
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"
    assert record["replays"][-1]["outcome"] == "failed"
    assert "outcome" not in record.get("error", {})  # no live error written


def test_a_guard_whose_stored_result_is_failed_is_refused_without_the_flag() -> None:
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    guard = f"call:{key}"
    bus.store.forget_guards()  # type: ignore[attr-defined]
    owner = "someone"
    assert bus.store.guard_take(guard, owner, bus.clock(), dt.timedelta(seconds=5)) is None
    bus.store.guard_finish(guard, owner, bus.clock(), succeeded=False,
                           result={"type": "Timeout", "message": "no answer"})
    report = job(bus, world.router()).run()
    assert report.counts["failed"] == 1 and world.calls == [key]
    assert "--allow-new-calls" in report.failures[0]["reason"]
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"


def test_a_guard_leased_by_a_live_delivery_is_never_called_by_an_allowed_rebuild() -> None:
    world = World()
    bus = make_bus(world)
    (key,) = published(bus, 1)
    guard = f"call:{key}"
    bus.store.forget_guards()  # type: ignore[attr-defined]
    # A live delivery holds the guard right now (its call in flight).
    assert bus.store.guard_take(guard, "live", bus.clock(), dt.timedelta(seconds=600)) is None
    report = job(bus, world.router(), new_calls=True).run()
    assert world.calls == [key] and report.counts["failed"] == 1
    record = bus.record(key)
    assert record is not None and record["event_status"] == "SUCCESS"


# -- archive events without a record: what the rebuild leaves behind ---------------------------
def archived(root: Path, numbers: list[int]) -> tuple[Path, list[tuple[bytes, dict[str, str]]]]:
    from tests.archive_files import event_message, record, write_archive

    messages = [event_message(n) for n in numbers]
    write_archive(root / "2024-03-01" / "a.avro",
                  [record(data, attributes, message_id=f"m-{n}")
                   for n, (data, attributes) in zip(numbers, messages, strict=True)])
    return root, messages


def located(bus: LocalBus, message: tuple[bytes, dict[str, str]]) -> Any:
    return bus.processor.locate(Delivery(message[0], message[1], message_id="x"))


def redrive_and_deliver(bus: LocalBus) -> None:
    from eventbus.workers.redrive import Redriver

    Redriver(bus.store, bus.publisher, bus.settings, now=bus.clock,
             locate=bus.processor.locate).sweep()
    bus.drain()


def test_an_archive_rebuild_refused_for_a_new_call_never_leads_to_the_call() -> None:
    """Without --allow-new-calls, an archived event's guarded call is refused: stored FAILED
    for good, and no sweeper ever runs it live behind the operator's back."""
    import tempfile

    world = World()
    bus = make_bus(world)
    with tempfile.TemporaryDirectory() as root:
        path, messages = archived(Path(root), [1])
        report = job(bus, world.router(), archive=path).run()
    key = located(bus, messages[0]).key
    assert report.counts["failed"] == 1 and world.calls == []
    record = bus.record(key)
    assert record is not None and record["event_status"] == "FAILED"
    assert record["retryable"] is False
    bus.clock.advance(10 * 24 * 3600)
    redrive_and_deliver(bus)
    assert world.calls == []


def test_an_archived_event_whose_entity_stays_busy_is_never_run_live_later() -> None:
    import tempfile

    world = World()
    bus = make_bus(world, ordered=True, lease=3600)
    with tempfile.TemporaryDirectory() as root:
        path, messages = archived(Path(root), [1])
        where = located(bus, messages[0])
        order = where.order
        # A live holder keeps the entity for the whole rebuild.
        holds = bus.store.take_entities(
            {order.entity_key: _take(order, "live-key")}, bus.clock())
        assert holds.held(order.entity_key)
        report = job(bus, world.router(ordered=True), archive=path, retries=2).run()
    assert report.counts["busy"] == 1 and world.calls == []
    key = located(bus, messages[0]).key
    record = bus.record(key)
    assert record is not None and record["event_status"] == "PENDING"
    assert record["rebuild_made"] == report.rebuild_id
    from eventbus.ops.progress import status_table
    assert f"UNFINISHED {key}" in status_table(bus.store)  # shown to the operator
    # The live holder finishes; the store's sweeper comes round later.
    bus.store.finish_many([], bus.clock(), [_release(holds, order.entity_key)])
    bus.clock.advance(bus.settings.redrive_after_seconds * 4)
    redrive_and_deliver(bus)
    assert world.calls == []  # the partner was called in production already


def test_a_rebuild_dying_after_an_archived_events_claim_never_runs_it_live_later() -> None:
    import tempfile

    world = World()
    bus = make_bus(world)
    with tempfile.TemporaryDirectory() as root:
        path, messages = archived(Path(root), [1])
        first = job(bus, world.router(), archive=path)
        undo = crashing(bus.store, "claim_many")
        with pytest.raises(Crash):
            first.run()
        undo()
        key = located(bus, messages[0]).key
        assert (bus.record(key) or {}).get("event_status") in ("PENDING", "PROCESSING")
        bus.clock.advance(LEASE * 3)
        run = runs_of(bus.store).rebuild_get(first.report.rebuild_id)
        resumed = job(bus, world.router(), run=run, archive=path).run()
    # The resumed rebuild takes its record back (the dead claim's lease lapsed) and runs it
    # in replay mode: its call, never made here, is refused without --allow-new-calls.
    assert resumed.counts["rebuilt"] == 0 and resumed.counts["failed"] == 1, resumed
    assert "--allow-new-calls" in resumed.failures[0]["reason"]
    record = bus.record(key)
    assert record is not None and record["event_status"] == "FAILED"
    assert record["retryable"] is False
    bus.clock.advance(bus.settings.redrive_after_seconds * 4)
    redrive_and_deliver(bus)
    assert world.calls == []


def test_allow_new_calls_and_a_live_delivery_of_the_same_archived_key_call_once() -> None:
    """--allow-new-calls on an archived event while its message arrives live meanwhile."""
    import tempfile

    world = World()
    bus = make_bus(world)
    with tempfile.TemporaryDirectory() as root:
        path, messages = archived(Path(root), [1])
        key = located(bus, messages[0]).key
        live: list[Any] = []
        world.during[key] = lambda context: live.append(bus.publish_raw(*messages[0]))
        world.in_effect = lambda called: live.append(bus.publish_raw(*messages[0]))
        report = job(bus, world.router(), archive=path, new_calls=True).run()
    assert report.counts["rebuilt"] == 1
    assert [result.outcome.value for result in live] == ["in_progress", "in_progress"]
    assert world.calls == [key] and world.ran(key, replay=False) == 0
    bus.redeliver(key)  # once the rebuild stored it: a duplicate
    assert world.calls == [key] and world.ran(key, replay=False) == 0


def _take(order: Any, key: str) -> Any:
    from eventbus.store.base import EntityTake

    return EntityTake(order.fields(), (key,), (order.position,))


def _release(holds: Any, entity_key: str) -> Any:
    from eventbus.store.base import EntityRelease

    return EntityRelease(entity_key, holds.owner_of(entity_key), None, "", None)


# -- hostile selections -------------------------------------------------------------------------
@pytest.mark.parametrize(("content", "message"), [
    (b"p:a:1\np:a:\x002\n", "line 2"),
    ("p:a:1\np:a:\udcff\n".encode("utf-8", "surrogatepass"), "not UTF-8"),
    (b"p:a:1\n\xc3\x28\n", "not UTF-8"),
    (("p:a:" + "x" * 5000 + "\n").encode(), "line 1"),
], ids=["nul", "lone-surrogate", "not-utf8", "too-long"])
def test_hostile_keys_files_are_one_line_and_touch_nothing(
        tmp_path: Path, content: bytes, message: str) -> None:
    from eventbus.ops import cli

    path = tmp_path / "keys.txt"
    path.write_bytes(content)
    store = MemoryEventStore()
    code, _out, err = _cli(cli, store, "rebuild", "--keys", str(path), "--app",
                          "tests.review.test_rebuild_probes:ROUTES")
    assert code == 2 and message in err, err
    assert "Traceback" not in _out + err and runs_of(store).rebuild_runs(10) == []


ROUTES = World().router()


def _cli(cli: Any, store: Any, *argv: str) -> tuple[int, str, str]:
    import io

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "open_store", lambda settings: store)
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_a_huge_keys_file_is_refused_before_anything_runs(
        tmp_path: Path, mongo_uri: str, mongo_db: Any) -> None:
    """A keys file of 300,000 keys (about 20 MB): the run document stores the selection's
    keys, and one MongoDB document holds 16 MB at most. Before the fix the rebuild printed
    its id ("resume with --resume rb-...") and then died saving that document
    (DocumentTooLarge), leaving an id that --resume does not know."""
    from eventbus.ops import cli
    from eventbus.store.mongo import MongoEventStore

    store = MongoEventStore.from_settings(Settings(mongodb_uri=mongo_uri,
                                                   mongodb_db=mongo_db.name))
    store.ensure_indexes()
    path = tmp_path / "keys.txt"
    path.write_text("".join(f"p:acme:order-{n:07d}:OR_MGMT:{'f' * 32}\n"
                            for n in range(300_000)))
    code, _out, err = _cli(cli, store, "rebuild", "--keys", str(path), "--app",
                          "tests.review.test_rebuild_probes:ROUTES", "--json")
    assert code == 2 and "split the file" in err, err[-2000:]
    assert "Traceback" not in err and "--resume" not in err
    assert runs_of(store).rebuild_runs(10) == []
    store.close()


# -- verify with a handler that reaches out -------------------------------------------------------
def _verify_app(stamp: Callable[[Context], Any], *, writes: bool = False) -> Router:
    routes = Router()

    @routes.handler("ORDER")
    def order(context: Context) -> None:
        if writes:
            context.db["projection"].insert_one({"n": context.event.entity_data["n"]})
        context.emit("STEP", {"at": stamp(context)})

    routes.handler("STEP", internal=True)(lambda context: None)
    return routes


def _recorded(router: Router, database: Any = None) -> tuple[LocalBus, list[Any]]:
    """The bus (closed: its store and clock are what the tests use) and its ORDER record."""
    with LocalBus(router, database=database) as bus:
        bus.publish("ORDER", {"n": 1}, entity=ENTITY)
    records = bus.store.find_events(EventQuery(statuses=("SUCCESS",), event_type="ORDER"),
                                    limit=10)
    return bus, records


def test_verify_never_writes_to_the_handlers_real_database(mongo_db: Any) -> None:
    pytest.importorskip("mongomock")
    from eventbus.rebuild.verify import StoreLookups, Verifier

    app = _verify_app(lambda context: 1, writes=True)
    bus, records = _recorded(app, database=mongo_db)
    assert mongo_db["projection"].count_documents({}) == 1
    with Verifier(app, StoreLookups(bus.store)) as verifier:
        report = verifier.run(records)
    assert report.counts()["same"] == 1 and report.exit_code() == 0
    assert mongo_db["projection"].count_documents({}) == 1  # the sandbox's, not this one


def test_verify_flags_a_handler_that_reads_the_wall_clock() -> None:
    """A child stamped with the wall clock differs every run: verify must not pass it."""
    from eventbus.rebuild.verify import StoreLookups, Verifier

    ticks = iter(range(1000))
    app = _verify_app(lambda context: next(ticks))  # stands in for datetime.now()
    bus, records = _recorded(app)
    with Verifier(app, StoreLookups(bus.store)) as verifier:
        report = verifier.run(records)
    assert report.counts().get("different") == 1 and report.exit_code() == 1


def test_verify_after_a_rebuild_passes_an_unchanged_app_that_uses_context_now() -> None:
    from eventbus.rebuild.verify import StoreLookups, Verifier

    app = _verify_app(lambda context: context.now().isoformat())
    bus, records = _recorded(app)
    with Verifier(app, StoreLookups(bus.store)) as verifier:
        assert verifier.run(records).exit_code() == 0
    bus.clock.advance(3600)
    selection = Selection(EventQuery(event_type="ORDER"))
    run = new_run(by="ops", why="probe", started=bus.clock(), selection=selection, flags={})
    replay = Replay(str(run["rebuild_id"]), "ops", "probe", bus.clock())
    processor = ReplayProcessor(bus.store, app, bus.settings, bus.clock, replay,
                                sleep=bus.clock.sleep, monotonic=bus.clock.monotonic)
    try:
        assert Rebuild(runs_of(bus.store), processor, StoredSource(bus.store, selection), run,
                       sleep=bus.clock.sleep, monotonic=bus.clock.monotonic).run().counts[
                           "rebuilt"] == 1
    finally:
        processor.close()
    rebuilt = bus.store.find_events(EventQuery(statuses=("SUCCESS",), event_type="ORDER"),
                                    limit=10)
    with Verifier(app, StoreLookups(bus.store)) as verifier:
        report = verifier.run(rebuilt)
    assert report.exit_code() == 0, report.to_json()
