"""``eventbus rebuild --from-archive`` on the in-memory store: archived events rebuilt.

The archive files are written by the test in the Cloud Storage subscription's
Avro layout (``tests.archive_files``), good ones beside hostile ones; the
rebuild reads them through ``ArchiveSource`` and the real replay pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.rebuild.archive import (
    FORM,
    ArchivedMessage,
    ArchiveProblem,
    read_archive,
    to_delivery,
)
from eventbus.rebuild.mode import ARCHIVE_FORM, ReplayProcessor
from eventbus.rebuild.runner import ArchiveSource, Rebuild, Report, Selection, new_run
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import LocalBus
from tests.archive_files import avro_bytes, event_message, record, write_archive
from tests.closing import closed_after_test
from tests.run_stores import runs_of


class World:
    """A projection and the partner calls made, per key."""

    def __init__(self) -> None:
        self.db: dict[str, Any] = {}
        self.calls: list[str] = []

    def router(self, *, guarded: bool = False) -> Router:
        routes = Router()

        @routes.handler("OR_MGMT")
        def on_order(context: Context) -> None:
            self.db[context.event.entity_metadata.entity_id] = context.event.entity_data["n"]
            if guarded:
                context.guard.run(context.key, lambda: self._call(context.key))

        return routes

    def _call(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        return {"status_code": 200}


def archive(root: Path, numbers: list[int], *, name: str = "2024-03-01/a.avro") -> Path:
    records = [record(*event_message(n), message_id=f"m-{n}") for n in numbers]
    return write_archive(root / name, records)


def rebuild(bus: LocalBus, router: Router, path: Path, *, query: EventQuery | None = None,
            **flags: bool) -> Report:
    selection = Selection(query or EventQuery())
    run = new_run(by="ops@example", why="restore", started=bus.clock(), selection=selection,
                  flags=flags, archive=str(path))
    replay = Replay(run["rebuild_id"], "ops@example", "restore", bus.clock(),
                    new_calls=flags.get("new_calls", False),
                    emit_new=flags.get("emit_new", False))
    processor = closed_after_test(ReplayProcessor(bus.store, router, bus.settings, bus.clock,
                                                  replay, after_success=bus.relay,
                                                  sleep=bus.clock.sleep,
                                                  monotonic=bus.clock.monotonic))
    source = ArchiveSource(bus.store, str(path), processor.locate, selection=selection)
    report = Rebuild(runs_of(bus.store), processor, source, run, sleep=bus.clock.sleep,
                     monotonic=bus.clock.monotonic).run()
    bus.drain()
    return report


def key_of(bus: LocalBus, number: int) -> str:
    """The key the processor gives archived message ``number``."""
    data, attributes = event_message(number)
    return bus.processor.locate(Delivery(data, attributes, message_id="x")).key


def test_the_archive_form_is_the_one_the_processor_recognises() -> None:
    assert FORM == ARCHIVE_FORM


def test_archived_events_without_records_become_new_records_and_bad_files_are_listed(
        tmp_path: Path) -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router()))
    # One event still has its record here: it was processed live from the same message.
    data, attributes = event_message(3)
    live = bus.publish_raw(data, attributes)
    assert live.outcome.value == "processed"
    archive(tmp_path, [1, 2, 1])  # message 1 twice: the archive is at-least-once
    (tmp_path / "2024-03-01" / "b.avro").write_bytes(
        avro_bytes([record(*event_message(9))])[:-7])  # cut short
    write_archive(tmp_path / "2024-03-02" / "c.avro",
                  [record(b"{not json", {}, message_id="bad"),
                   record(*event_message(3), message_id="m-3")])
    world.db.clear()  # the projection was lost: the rebuild makes it again
    report = rebuild(bus, world.router(), tmp_path)
    assert world.db == {"o-1": 1, "o-2": 2, "o-3": 3}
    assert report.counts["rebuilt"] == 3
    reasons = [f"{f['key']}: {f['reason']}" for f in report.failures]
    assert any("b.avro" in reason and "archive:" in reason for reason in reasons), reasons
    assert any("c.avro record 0" in reason and "not an event" in reason for reason in reasons)
    assert report.counts["failed"] == len(report.failures) >= 2
    for number in (1, 2):
        stored = bus.record(key_of(bus, number))
        assert stored is not None and stored["event_status"] == "SUCCESS"
        (entry,) = stored["replays"]
        assert entry["source"] == "archive" and entry["new_record"] is True
        assert entry["rebuild"] == report.rebuild_id and entry["outcome"] == "rebuilt"
        assert stored["pubsub"]["form"] == "archive" and "lease_until" not in stored
    kept = bus.record(live.key)
    assert kept is not None and kept["event_status"] == "SUCCESS"
    (entry,) = kept["replays"]
    assert entry["source"] == "archive" and "new_record" not in entry
    saved = runs_of(bus.store).rebuild_get(report.rebuild_id)
    assert saved is not None and saved["archive"] == str(tmp_path)
    assert saved["status"] == "finished" and saved["counts"]["rebuilt"] == 3


def test_a_new_record_has_no_first_result_so_its_guarded_call_is_refused_unless_allowed(
        tmp_path: Path) -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router(guarded=True)))
    archive(tmp_path, [1], name="one/a.avro")
    archive(tmp_path, [2], name="two/a.avro")
    refused = rebuild(bus, world.router(guarded=True), tmp_path / "one")
    assert world.calls == [] and refused.counts["failed"] == 1
    assert "--allow-new-calls" in refused.failures[0]["reason"]
    stored = bus.record(key_of(bus, 1))
    # FAILED for good, so nothing runs it by itself later; its audit entry says why.
    assert stored is not None and stored["event_status"] == "FAILED"
    assert stored["retryable"] is False
    assert stored["replays"][0]["outcome"] == "failed"
    assert stored["replays"][0]["new_record"] is True
    again = rebuild(bus, world.router(guarded=True), tmp_path / "one", new_calls=True)
    assert again.counts["skipped"] == 1 and world.calls == []  # a record exists now
    allowed = rebuild(bus, world.router(guarded=True), tmp_path / "two", new_calls=True)
    assert allowed.counts["rebuilt"] == 1 and world.calls == [key_of(bus, 2)]
    made = bus.record(key_of(bus, 2))
    assert made is not None and made["event_status"] == "SUCCESS"


def test_filters_narrow_an_archive_and_a_rebuild_runs_each_event_once(tmp_path: Path) -> None:
    world = World()
    bus = closed_after_test(LocalBus(world.router()))
    archive(tmp_path, [1, 2, 3])
    narrowed = rebuild(bus, world.router(), tmp_path,
                       query=EventQuery(entity_id="o-2"))
    assert narrowed.total == 1 and world.db == {"o-2": 2}
    everything = rebuild(bus, world.router(), tmp_path)
    assert everything.counts["rebuilt"] == 3 and world.db == {"o-1": 1, "o-2": 2, "o-3": 3}
    stored = bus.record(key_of(bus, 2))
    assert stored is not None and [e.get("new_record") for e in stored["replays"]] == \
        [True, None]


def test_every_message_of_the_good_files_is_read_beside_a_hostile_one(tmp_path: Path) -> None:
    archive(tmp_path, [1, 2])
    (tmp_path / "2024-03-01" / "z.avro").write_bytes(b"Obj\x01 not really avro")
    found = list(read_archive(tmp_path))
    messages = [m for m in found if isinstance(m, ArchivedMessage)]
    problems = [m for m in found if isinstance(m, ArchiveProblem)]
    assert [m.message_id for m in messages] == ["m-1", "m-2"]
    assert all(isinstance(to_delivery(m), Delivery) for m in messages)
    assert len(problems) == 1 and problems[0].file.endswith("z.avro")
