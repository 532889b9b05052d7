"""``eventbus verify --from-archive``: archived events against their record, else the archive.

An app runs on LocalBus; every message it put on the bus (parents and the
children the relay published, cascade links in their attributes) is written
by the test as archive files in the Cloud Storage subscription's Avro layout
(``tests.archive_files``). Then ``eventbus verify --from-archive`` runs in this
process (``cli_run``: no publisher may be asked for) on a store that has the
records, or some, or none.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from eventbus import Context
from eventbus.model.router import Router
from eventbus.rebuild.archive import read_archive
from eventbus.rebuild.verify import StoreLookups, Verifier
from eventbus.rebuild.verify.from_archive import (
    ArchiveLookups,
    ArchiveVerifier,
    index_archive,
    ordered_children,
    select_archived,
)
from eventbus.store.memory import MemoryEventStore
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import LocalBus, Message
from tests.archive_files import PUBLISHED, record, write_archive
from tests.verify.recording import cli_run
from tests.verify.test_verifier import ENTITY, app, two_steps

BASE = app(two_steps)
APP = ("--app", "tests.verify.test_from_archive:BASE")


def renamed_step(context: Context) -> None:
    context.emit("STEP_C", {"n": context.event.entity_data["n"]})
    context.emit("STEP_B", {"n": 1})


RENAMED = app(renamed_step)


def run(router: Router, numbers: Sequence[int]) -> tuple[LocalBus, list[Message]]:
    """The orders ``numbers`` run on LocalBus (closed: its store is what the tests read);
    every bus message, in the order published."""
    with LocalBus(router) as bus:
        for n in numbers:
            bus.publish("ORDER", {"n": n, "orderId": 100 + n}, entity=ENTITY)
            bus.clock.advance(1)
    return bus, list(bus.messages.values())


def archive(path: Path, messages: Iterable[Message], *,
            start: dt.datetime = PUBLISHED) -> Path:
    """``messages`` as one archive file, published a second apart from ``start``."""
    return write_archive(path, [
        record(m.data, m.attributes, message_id=m.message_id or f"m-{i}",
               published=start + dt.timedelta(seconds=i), ordering_key=m.ordering_key)
        for i, m in enumerate(messages)])


def orders(messages: Iterable[Message]) -> list[Message]:
    return [m for m in messages if m.attributes.get("event_type") == "ORDER"]


def test_an_unchanged_app_passes_on_the_archive_alone(tmp_path: Path) -> None:
    _, messages = run(BASE, [0, 1])
    path = archive(tmp_path / "2024-03-01" / "a.avro", messages)
    assert len(messages) == 6  # 2 orders, 4 children: the children are archived too
    code, out, err = cli_run(MemoryEventStore(), "verify", "--from-archive", str(tmp_path),
                             "--settle", "0", *APP)
    assert code == 0, out + err
    assert "verified 6 events: 6 same" in out and "6 against the archive" in out
    assert path.exists()


def test_a_renamed_step_fails_naming_the_event_and_the_child(tmp_path: Path) -> None:
    bus, messages = run(BASE, [0])
    archive(tmp_path / "a.avro", messages)
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(tmp_path),
                           "--settle", "0", "--app", "tests.verify.test_from_archive:RENAMED")
    assert code == 1
    parent = next(key for key, m in bus.messages.items()
                  if m.attributes["event_type"] == "ORDER")
    (line,) = [line for line in out.splitlines() if line.startswith("DIFFERENT")]
    assert parent in line and f"{parent}/0:STEP_A" in line and f"{parent}/0:STEP_C" in line
    assert "1 different" in out


def test_a_hostile_file_beside_good_ones_is_listed_and_stops_nothing(tmp_path: Path) -> None:
    _, messages = run(BASE, [0])
    archive(tmp_path / "2024-03-01" / "a.avro", messages)
    (tmp_path / "2024-03-01" / "b.avro").write_bytes(b"Obj\x01 not really avro")
    good = (tmp_path / "2024-03-01" / "a.avro").read_bytes()
    (tmp_path / "2024-03-01" / "c.avro").write_bytes(good[: len(good) - 40])  # cut short
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(tmp_path),
                           "--settle", "0", *APP)
    assert code == 1
    unreadable = [line for line in out.splitlines() if line.startswith("UNREADABLE")]
    assert len(unreadable) == 2
    assert "b.avro" in unreadable[0] and "not an Avro file" in unreadable[0]
    assert "c.avro" in unreadable[1]
    assert "3 same" in out  # the good file's order and both children, once each
    code, _, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(tmp_path),
                         "--settle", "0", "--allow-unverifiable", *APP)
    assert code == 0


def test_an_event_whose_record_exists_is_verified_on_the_record(tmp_path: Path) -> None:
    stored, messages = run(BASE, [0, 1])
    _, others = run(BASE, [2])
    # The stored orders' children are not archived: judged on the archive, they would
    # differ (the code emits two children each); on their records they are the same.
    archive(tmp_path / "a.avro", [*orders(messages), *others])
    code, out, err = cli_run(stored.store, "verify", "--from-archive", str(tmp_path),
                             "--settle", "0", *APP)
    assert code == 0, out + err
    assert "verified 5 events: 5 same" in out
    assert "(2 against their stored record, 3 against the archive)" in out

    index = index_archive(read_archive(tmp_path))
    events, _ = select_archived(index, EventQuery())
    records = {key: r for key in index.events if (r := stored.store.get(key)) is not None}
    with Verifier(BASE, ArchiveLookups(StoreLookups(stored.store), index)) as verifier:
        verdicts = list(ArchiveVerifier(verifier, index, records, settle=dt.timedelta(0))
                        .verify(events))
    assert [(v.event_type, v.basis) for v in verdicts if v.basis == "record"] == \
        [("ORDER", "record"), ("ORDER", "record")]
    # Without the records, the same archive shows the missing children as differences.
    with Verifier(BASE, ArchiveLookups(StoreLookups(MemoryEventStore()), index)) as verifier:
        alone = ArchiveVerifier(verifier, index, {}, settle=dt.timedelta(0))
        judged = [alone.verify_one(event) for event in events]
    assert [v.state for v in judged if v.event_type == "ORDER"] == ["different", "different",
                                                                      "same"]


def test_no_children_counts_as_none_only_where_the_archive_runs_past_settle(
        tmp_path: Path) -> None:
    _, messages = run(BASE, [0])
    _, late = run(BASE, [1])
    archive(tmp_path / "a.avro", orders(messages))
    archive(tmp_path / "b.avro", late, start=PUBLISHED + dt.timedelta(hours=2))
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(tmp_path),
                           "--json", *APP)
    report = json.loads(out)
    states = {v["key"]: v for v in report["verdicts"]}
    early = next(v for v in states.values() if v["state"] == "different")
    # The early order: no children archived, two hours of archive after it: "emitted
    # nothing", so the code's two children are new.
    assert [d["kind"] for d in early["differences"]] == ["new", "new"]
    late_ones = [v for v in states.values() if v["state"] == "unverifiable"]
    assert len(late_ones) == 3 and all("within --settle 3600 s" in v["reason"]
                                       for v in late_ones)
    assert code == 1


def test_filters_keys_and_limit_select_archived_events(tmp_path: Path) -> None:
    bus, messages = run(BASE, [0, 1, 2])
    root = tmp_path / "archive"
    archive(root / "a.avro", messages)
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(root),
                           "--settle", "0", "--type", "ORDER", *APP)
    assert code == 0 and "verified 3 events: 3 same" in out
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(root),
                           "--settle", "0", "--limit", "2", *APP)
    assert code == 0 and "verified 2 events: 2 same" in out
    first = next(iter(bus.messages))
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{first}\nnot-archived\n")
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive",
                           str(root / "a.avro"), "--settle", "0", "--keys", str(keys), *APP)
    assert code == 1 and "1 same" in out and "not-archived" in out
    assert "not in the archive" in out
    cut = (PUBLISHED + dt.timedelta(seconds=3)).isoformat()
    code, out, _ = cli_run(MemoryEventStore(), "verify", "--from-archive", str(root),
                           "--settle", "0", "--since", cut, *APP)
    assert code == 0 and "verified 6 events" in out  # published from the 4th message on


def test_an_archive_that_cannot_be_listed_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, _, err = cli_run(MemoryEventStore(), "verify", "--from-archive",
                           str(tmp_path / "nowhere"), *APP)
    assert code == 2 and "no such file or directory" in err and "Traceback" not in err


def test_children_are_ordered_by_their_keys_and_a_gap_is_unjudgeable(tmp_path: Path) -> None:
    _, messages = run(BASE, [0])
    parent, first, second = messages
    archive(tmp_path / "a.avro", [parent, second, first])  # published out of order
    index = index_archive(read_archive(tmp_path))
    (key,) = [k for k, e in index.events.items() if not e.parent_key]
    ordered, why = ordered_children(key, index.children[key])
    assert why == "" and [c.key for c in ordered] == [f"{key}/0:STEP_A", f"{key}/1:STEP_B"]
    gap = index_archive(read_archive(archive(tmp_path / "gap" / "a.avro", [parent, second])))
    assert gap.children[key][0].key.endswith("/1:STEP_B")
    _, why = ordered_children(key, gap.children[key])
    assert "children 1, not 0..1" in why
