"""``eventbus rebuild`` on the real MongoDB-compatible server: runs, dry runs, hostile input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ops.conftest import Bus, routes
from tests.run_stores import runs_of

APP = "tests.ops.conftest:routes"


def _succeeded(bus: Bus, count: int) -> list[str]:
    keys = []
    for number in range(count):
        result = bus.deliver("SUB_MGMT", n=number)
        assert result.outcome.value == "processed"
        keys.append(result.key)
    return keys


def test_a_rebuild_runs_each_success_once_and_keeps_its_history(bus: Bus) -> None:
    keys = _succeeded(bus, 3)
    code, out, err = bus.run("rebuild", "--type", "SUB_MGMT", "--app", APP, "--why", "bug 7",
                             "--batch", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["counts"]["rebuilt"] == 3 and report["failures"] == []
    for key in keys:
        record = bus.store.get(key)
        assert record is not None and record["event_status"] == "SUCCESS"
        (entry,) = record["replays"]
        assert entry["why"] == "bug 7" and entry["by"] == "ops@example.com"
        assert entry["rebuild"] == report["rebuild_id"] and "rebuild_lease" not in record
    run = runs_of(bus.store).rebuild_get(report["rebuild_id"])
    assert run is not None and run["status"] == "finished" and run["counts"]["rebuilt"] == 3
    # Resuming a finished rebuild runs nothing again.
    code, out, err = bus.run("rebuild", "--resume", report["rebuild_id"], "--app", APP, "--json")
    assert code == 0, err
    assert json.loads(out)["counts"]["rebuilt"] == 3
    assert all(len((bus.store.get(key) or {})["replays"]) == 1 for key in keys)
    # show prints each replay entry's rebuild id, outcome and child counts (OPERATORS.md).
    code, out, err = bus.run("show", keys[0], "--wide")
    assert code == 0, err
    replays = out.split("replays:", 1)[1]
    assert report["rebuild_id"] in replays and "rebuilt" in replays
    assert "0 same, 0 changed, 0 new" in replays


def test_a_dry_run_lists_and_writes_nothing(bus: Bus, tmp_path: Path) -> None:
    keys = _succeeded(bus, 2)
    path = tmp_path / "keys.txt"
    path.write_text("\n".join([*keys, "# a comment", "", "p:nobody:missing"]) + "\n")
    code, out, _ = bus.run("rebuild", "--keys", str(path), "--app", APP, "--dry-run",
                             "--json")
    plan = json.loads(out)
    assert code == 1  # a key without an event
    assert plan["keys"] == keys and plan["missing"] == ["p:nobody:missing"]
    assert all("replays" not in (bus.store.get(key) or {}) for key in keys)
    assert runs_of(bus.store).rebuild_runs(10) == []


@pytest.mark.parametrize(("setup", "argv", "message"), [
    (None, ["--keys", "/no/such/file"], "cannot read"),
    (b"p:a:1\n\xff\xfe\n", ["--keys", "{path}"], "not UTF-8"),
    (b"p:a:1\nbad\x07key\n", ["--keys", "{path}"], "line 2"),
    (b"\n# nothing\n", ["--keys", "{path}"], "holds no keys"),
    (None, ["--type", "X", "--since", "2026-01-02", "--until", "2026-01-01"], "before --until"),
    (None, ["--type", "X", "--why", "bad \udcff text"], "not UTF-8"),
    (None, ["--resume", "rb-nothing"], "no rebuild"),
    (None, [], "needs --keys FILE or at least one filter"),
])
def test_hostile_input_is_one_clear_line_never_a_traceback(
        bus: Bus, tmp_path: Path, setup: bytes | None, argv: list[str], message: str) -> None:
    path = tmp_path / "keys.txt"
    if setup is not None:
        path.write_bytes(setup)
    code, out, err = bus.run("rebuild", "--app", APP,
                             *[arg.replace("{path}", str(path)) for arg in argv])
    assert code == 2
    assert message in err and "Traceback" not in err + out
    assert runs_of(bus.store).rebuild_runs(10) == []


def test_a_bad_time_is_refused_by_the_parser(bus: Bus) -> None:
    # argparse's own usage error: exit status 2 and one line, as for every command.
    with pytest.raises(SystemExit) as stopped:
        bus.run("rebuild", "--app", APP, "--since", "yesterday-ish")
    assert stopped.value.code == 2
    assert runs_of(bus.store).rebuild_runs(10) == []


def _archive(root: Path) -> list[str]:
    """Two SUB_MGMT messages in the subscription's layout, and a file cut short beside them."""
    from tests.archive_files import avro_bytes, event_message, record, write_archive

    messages = [event_message(n, event_type="SUB_MGMT") for n in (1, 2)]
    write_archive(root / "2024-03-01" / "a.avro",
                  [record(data, attributes, message_id=f"m-{n}")
                   for n, (data, attributes) in enumerate(messages)])
    (root / "2024-03-01" / "b.avro").write_bytes(avro_bytes([record(*messages[0])])[:-5])
    return [bus_key(data, attributes) for data, attributes in messages]


def bus_key(data: bytes, attributes: dict[str, str]) -> str:
    """The key the processor gives a message (``record_key``: partner-scoped)."""
    from eventbus.model.delivery import Delivery
    from eventbus.processor.intake import Intake
    from eventbus.store.memory import MemoryEventStore

    return Intake(MemoryEventStore(), routes).locate(Delivery(data, attributes)).key


def test_a_rebuild_from_an_archive_stores_the_events_without_records(
        bus: Bus, tmp_path: Path) -> None:
    keys = _archive(tmp_path)
    code, out, err = bus.run("rebuild", "--from-archive", str(tmp_path), "--app", APP,
                             "--dry-run")
    assert code == 0, err
    assert out.count("run (new record)") == 2 and "2 events would run again" in out
    assert all(bus.store.get(key) is None for key in keys)
    code, out, err = bus.run("rebuild", "--from-archive", str(tmp_path), "--app", APP,
                             "--why", "restore", "--json")
    report = json.loads(out)
    assert code == 1, err  # the file cut short is a failure of the report
    assert report["counts"]["rebuilt"] == 2
    (failure,) = report["failures"]
    assert failure["key"].startswith(f"{tmp_path}/2024-03-01/b.avro"), failure
    assert failure["reason"].startswith("cannot be rebuilt: archive:"), failure
    for key in keys:
        record = bus.store.get(key)
        assert record is not None and record["event_status"] == "SUCCESS", record
        (entry,) = record["replays"]
        assert entry["source"] == "archive" and entry["new_record"] is True
        assert entry["why"] == "restore" and "lease_until" not in record
    run = runs_of(bus.store).rebuild_get(report["rebuild_id"])
    assert run is not None and run["archive"] == str(tmp_path)
    # Resumed, the same archive is read again and nothing runs twice.
    code, out, err = bus.run("rebuild", "--resume", report["rebuild_id"], "--app", APP, "--json")
    assert json.loads(out)["counts"]["rebuilt"] == 2, err
    assert all(len((bus.store.get(key) or {})["replays"]) == 1 for key in keys)


def test_an_archive_that_cannot_be_listed_is_one_line(bus: Bus, tmp_path: Path) -> None:
    code, out, err = bus.run("rebuild", "--from-archive", str(tmp_path / "none"), "--app", APP)
    assert code == 2 and "no such file or directory" in err
    assert "Traceback" not in out + err and runs_of(bus.store).rebuild_runs(10) == []
    code, _, err = bus.run("rebuild", "--from-archive", "s3://bucket/x", "--app", APP)
    assert code == 2 and "gs://" in err
