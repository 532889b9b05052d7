"""The operator commands against the real server: their tables, their JSON, their exit codes."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from eventbus.model.errors import PartnerPaused
from eventbus.ops.reports import failed_groups, failed_query, group_id, normalise
from eventbus.pubsub.message import build_event, build_message
from eventbus.store.documents import error_document
from eventbus.store.memory import MemoryEventStore
from eventbus.store.operator_queries import EventQuery
from tests.ops.conftest import FIXED, Bus

ESC = "\x1b[2J\x1b]0;owned\x07"
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)


def seed(bus: Bus) -> dict[str, str]:
    """Two permanent failures of one cause, one of another, a retrying one, two successes."""
    keys = {
        "perm1": bus.deliver(mode="permanent", orderId=12345, tag="perm1").key,
        "perm2": bus.deliver(mode="permanent", orderId=67890, tag="perm2").key,
        "transient": bus.deliver(mode="transient", orderId=5000, tag="t1").key,
        "ok": bus.deliver(tag="ok").key,
        "other": bus.deliver("SUB_MGMT", partner="p-2").key,
    }
    return keys


def test_failed_groups_by_cause_in_a_table_and_in_json(bus: Bus) -> None:
    keys = seed(bus)
    code, out, _ = bus.run("failed")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["group", "count", "retrying", "final", "event_type", "error",
                                "message"]
    cause = group_id("OR_MGMT", "PermanentError", "no such order <number>")
    assert lines[2].split()[:6] == [cause, "2", "0", "2", "OR_MGMT", "PermanentError"]
    assert lines[3].split()[1:6] == ["1", "1", "0", "OR_MGMT", "ConnectionError"]
    assert "3 failed events in 2 groups" in out
    data = bus.json("failed")
    assert data["truncated"] is False
    first = data["groups"][0]
    assert (first["group"], first["count"], first["final"]) == (cause, 2, 2)
    assert sorted(first["keys"]) == sorted([keys["perm1"], keys["perm2"]])
    assert first["classifications"] == {"permanent": 2}


def test_failed_filters(bus: Bus) -> None:
    keys = seed(bus)
    retrying = bus.json("failed", "--retryable", "--list")["events"]
    assert [e["key"] for e in retrying] == [keys["transient"]]
    final = bus.json("failed", "--final", "--list")["events"]
    assert [e["key"] for e in final] == [keys["perm2"], keys["perm1"]]
    assert bus.json("failed", "--partner", "p-2")["groups"] == []
    assert bus.json("failed", "--type", "SUB_MGMT")["groups"] == []
    assert len(bus.json("failed", "--since", "1h")["groups"]) == 0  # all made 2 h ago
    assert len(bus.json("failed", "--since", "3h")["groups"]) == 2
    code, out, _ = bus.run("failed", "--type", "NOPE")
    assert (code, out.strip()) == (0, "no failed events")


def test_history_is_newest_first_with_a_limit(bus: Bus) -> None:
    keys = seed(bus)
    code, out, _ = bus.run("history", "--partner", "p-1", "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    # Issue 42: a row with its key is wider than 100 columns, so each key is on a line of
    # its own, whole, above the rest of its row.
    assert lines[0] == "key"
    assert lines[1].split() == ["created", "event_type", "status", "attempts", "partner",
                                "error"]
    assert lines[3] == keys["ok"] and "SUCCESS" in lines[4]
    assert lines[5] == keys["transient"] and "FAILED(retrying)" in lines[6]
    assert len(lines) == 7 and max(map(len, lines)) <= 100
    events = bus.json("history", "--partner", "p-1")["events"]
    assert [e["key"] for e in events] == [keys[n] for n in ("ok", "transient", "perm2",
                                                             "perm1")]
    assert bus.run("history", "--partner", "nobody")[1].strip() == "no events of partner nobody"


def test_show_has_the_timeline_error_and_cascade(bus: Bus) -> None:
    key = bus.deliver(mode="transient", orderId=1, tag="t").key
    for _ in range(2):
        bus.clock.advance(9)
        (result,) = [bus.redeliver(*_message(bus, key))]
        assert result.key == key
    code, out, _ = bus.run("show", key)
    assert code == 0
    assert "status:       FAILED(retrying)" in out
    assert "ConnectionError: partner timed out after 1 ms [transient]" in out
    attempts = out[out.index("attempts:\n"):].splitlines()
    assert attempts[3].split()[0] == "1" and attempts[4].split()[-1] == "10.0s"
    assert attempts[5].split()[-1] == "9.0s"
    assert f"OR_MGMT  FAILED (retrying)  {key}  <--" in out
    data = bus.json("show", key)
    assert [a["delay_ms"] for a in data["attempts"]] == [None, 10000.0, 9000.0]
    assert data["record"]["idempotency_key"] == key and data["cascade"]["key"] == key
    code, _, err = bus.run("show", "nope")
    assert code == 1 and "no event with idempotency key 'nope'" in err


def _message(bus: Bus, key: str) -> tuple[bytes, dict[str, str], str]:
    record = bus.store.get(key)
    assert record is not None
    from eventbus.model.event import event_from_document
    from eventbus.model.keys import canonical_json

    event = event_from_document(record)
    bus.count += 1
    return (canonical_json(event.to_document()).encode(), record["pubsub"]["attributes"],
            f"m-{bus.count}")


def test_stored_values_are_escaped_everywhere(bus: Bus) -> None:
    partner = f"p-1{ESC}\u202e"
    key = bus.deliver(mode="permanent", orderId=ESC, tag="x", partner=partner).key
    # --wide: escaped, every value is longer than a table's cut (issue 42: tables fit 100).
    for argv in (["failed", "--wide"], ["failed", "--list", "--wide"],
                 ["history", "--partner", partner, "--wide"], ["show", key, "--wide"],
                 ["status", "--wide"], ["trace", key]):
        code, out, err = bus.run(*argv)
        assert code == 0, (argv, err)
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, argv
        assert "\\x1b" in out, argv
    code, out, _ = bus.run("show", key, "--json")
    assert out.isascii() and json.loads(out)["record"]["idempotency_key"] == key


def test_invalid_payload_shows_its_raw_payload_escaped(bus: Bus) -> None:
    result = bus.deliver(raw=b'{"event_type": "\x1b[31m')
    code, out, _ = bus.run("show", result.key)
    assert code == 0 and "raw_payload:" in out and "\x1b" not in out


def test_stats_counts_by_type_status_and_partner(bus: Bus) -> None:
    seed(bus)
    code, out, _ = bus.run("stats", "--hours", "3")
    assert code == 0
    assert out.startswith("5 events created since ")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.strip()}
    assert rows["event_type"] == ["SUCCESS", "FAILED(retrying)", "FAILED(final)", "total"]
    assert rows["OR_MGMT"] == ["1", "1", "2", "4"] and rows["SUB_MGMT"] == ["1", "0", "0", "1"]
    assert rows["p-1"] == ["1", "1", "2", "4"] and rows["p-2"] == ["1", "0", "0", "1"]
    data = bus.json("stats", "--since", "3h")
    assert data["total"] == 5
    assert data["by_partner"]["p-1"] == {"SUCCESS": 1, "FAILED(retrying)": 1, "FAILED(final)": 2}
    assert bus.run("stats", "--hours", "1")[1].startswith("no events created since")


def test_retries_percentiles_and_nearest_the_cap(bus: Bus) -> None:
    slow = bus.deliver(mode="transient", orderId=1, tag="a").key
    fast = bus.deliver(mode="transient", orderId=2, tag="b").key
    for delay_slow, delay_fast in ((10, 2), (20, 4), (40, 8)):
        bus.clock.advance(delay_slow)
        bus.redeliver(*_message(bus, slow))
        bus.clock.advance(delay_fast)
        bus.redeliver(*_message(bus, fast))
    data = bus.json("retries", "--offline", "--min-backoff", "1", "--max-backoff", "60")
    assert data["policy"] == {"min_backoff_s": 1.0, "max_backoff_s": 60.0, "source": "flags"}
    assert data["attempt_cap"] == 5 and data["scanned"] == 2
    second = data["attempts"][0]
    assert second["attempt"] == 2 and second["samples"] == 2
    assert second["max"] >= 10_000
    near = data["nearest_cap"]
    assert [(n["used"], n["left"]) for n in near] == [(4, 1), (4, 1)]
    code, out, _ = bus.run("retries", "--offline")
    assert code == 0 and "retry policy: backoff 10s..600s (flags); attempt cap 5" in out
    assert out.splitlines()[2].split() == ["attempt", "samples", "p50", "p90", "p99", "max"]
    assert "nearest the attempt cap:" in out


def test_normalise_masks_ids_numbers_and_quoted_values() -> None:
    # Issue 42: readable placeholders (were <n> and <s>).
    assert normalise("no such order 59734") == "no such order <number>"
    assert normalise("partner 'acme' answered 503") == "partner <text> answered 503"
    assert normalise("id 6231cfc8800d284c981b3146  gone") == "id <id> gone"
    assert normalise("x" * 500) == "x" * 200


def test_normalise_masks_a_whole_time_once_and_leaves_standards_named() -> None:
    first = "partner 'acme' paused until 2026-12-02T10:15:30Z: partner down"
    second = "partner 'acme' paused until 2026-12-02T11:02:59Z: partner down"
    assert normalise(first) == normalise(second) == \
        "partner <text> paused until <time>: partner down"
    assert normalise("ts: 2026-11-25T12:00:00.123+01:00 is not an RFC 3339 time") == \
        "ts: <time> is not an RFC 3339 time"
    assert normalise("took 12.5 s at 10:15:30, epoch 1764671730123") == \
        "took <number> s at <time>, epoch <number>"


def test_two_paused_partner_failures_differing_in_their_times_are_one_group() -> None:
    store = MemoryEventStore()
    for n, until in enumerate(["2026-12-02T10:15:30", "2026-12-02T11:02:59"]):
        claim = store.claim(f"k-{n}", {"event_type": "OR_MGMT"}, NOW)
        error = error_document(PartnerPaused("acme", dt.datetime.fromisoformat(until),
                                             "opened by hand"), "transient")
        store.fail(f"k-{n}", claim.owner, NOW, error, retryable=True)
    report = failed_groups(store, failed_query())
    assert [(group.count, group.message) for group in report.groups] == [
        (2, "partner <text> paused until <time>: opened by hand")]


# -- replay ---------------------------------------------------------------------------------

def test_replay_by_key_reopens_audits_republishes_and_succeeds_once(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=7, tag="fixme").key
    code, out, err = bus.run("replay", key, "--dry-run")
    assert code == 0 and key in out and "1 events would be replayed" in out
    assert bus.publisher.messages == []
    FIXED.add("fixme")
    code, out, err = bus.run("replay", key, "--why", "order restored")
    assert code == 0, err
    assert "1 of 1 replayed" in out and f"replay: 1/1 replayed {key}" in err
    record = bus.store.get(key)
    assert record is not None and record["retryable"] is True
    assert record["replayed_at_attempt"] == 1
    (entry,) = record["replays"]
    assert (entry["by"], entry["why"], entry["attempt"]) == ("ops@example.com",
                                                             "order restored", 1)
    (message,) = bus.publisher.messages
    assert message.attributes == record["pubsub"]["attributes"]
    (result,) = bus.replayed()
    assert result.key == key
    done = bus.store.get(key)
    assert done is not None and done["event_status"] == "SUCCESS"
    assert bus.store.database["ops_effects"].find_one({"_id": "fixme"})["runs"] == 1
    code, _, err = bus.run("replay", key)
    assert code == 1 and "is SUCCESS, not FAILED: not replayed" in err


def test_replay_a_group_asks_for_confirmation_above_the_threshold(bus: Bus,
                                                                   monkeypatch: object) -> None:
    for n in range(12):
        bus.deliver(mode="permanent", orderId=10_000 + n, tag=f"g{n}")
    cause = group_id("OR_MGMT", "PermanentError", "no such order <number>")
    code, _, err = bus.run("replay", "--group", cause[:6])
    assert code == 2 and "12 events to replay (more than 10): confirm with --yes" in err
    assert bus.publisher.messages == []
    code, out, err = bus.run("replay", "--group", cause, "--yes", "--rate", "1000/s", "--json")
    assert code == 0, err
    assert json.loads(out)["replayed"] == 12 and len(bus.publisher.messages) == 12
    code, _, err = bus.run("replay", "--group", "ffffffffffff")
    assert code == 2 and "no failed group" in err


def test_replay_by_filter_and_the_selection_rules(bus: Bus) -> None:
    keys = seed(bus)
    code, out, _ = bus.run("replay", "--final", "--dry-run", "--json")
    assert code == 0 and sorted(json.loads(out)["keys"]) == sorted([keys["perm1"],
                                                                   keys["perm2"]])
    code, _, err = bus.run("replay")
    assert code == 2 and "exactly one of" in err
    code, _, err = bus.run("replay", keys["perm1"], "--final")
    assert code == 2
    code, _, err = bus.run("replay", "missing-key")
    assert code == 1 and "no event with idempotency key 'missing-key'" in err


def test_replay_with_corrected_data_for_an_invalid_payload(bus: Bus, tmp_path: Path) -> None:
    bad = bus.deliver(raw=b'{"event_type": "OR_MGMT", "entity_metadata": 5}')
    corrected = {"event_type": "OR_MGMT", "event_version": "v1",
                 "entity_metadata": {"partnerId": "p-1", "entity_id": "order-9",
                                     "entity_type": "Order"},
                 "entity_data": {"tag": "fixed-data"}}
    path = tmp_path / "fixed.json"
    path.write_text('{"event_type": "OR_MGMT"}')
    code, out, _ = bus.run("replay", bad.key, "--data", str(path), "--wide")
    assert code == 1 and "not a valid event" in out
    path.write_text(json.dumps(corrected))
    code, _, err = bus.run("replay", bad.key)
    assert code == 1 and "stored as invalid" in bus.run("replay", bad.key, "--json")[1]
    code, out, err = bus.run("replay", bad.key, "--data", str(path), "--json")
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    # The corrected event runs under the refused record's own key.
    assert result["outcome"] == "replayed" and result["new_key"] == bad.key
    FIXED.add("fixed-data")
    (processed,) = bus.replayed()
    assert (processed.outcome.value, processed.key) == ("processed", bad.key)
    record = bus.store.get(bad.key) or {}
    assert record["event_status"] == "SUCCESS" and record["entity_data"] == {"tag": "fixed-data"}
    [refused] = record["rejections"]
    assert refused["raw_payload"].startswith('{"event_type"') and refused["error"]["message"]
    [audit] = record["replays"]
    assert audit["by"] == "ops@example.com" and audit["data"]["corrected"] is True
    assert bus.store.get_many([k for k in [result["new_key"]] if k != bad.key]) == []
    code, _, err = bus.run("replay", bad.key, "--data", str(path))
    assert code == 2 and "SUCCESS" in err and len(err.strip().splitlines()) == 1
    # The refused bytes published again land on the corrected record: the payload it was
    # corrected for, so a duplicate, neither a conflict nor a new refused record.
    again = bus.deliver(raw=b'{"event_type": "OR_MGMT", "entity_metadata": 5}')
    assert (again.outcome.value, again.key) == ("duplicate", bad.key)
    assert not [doc for doc in bus.store.summaries()
                if doc["idempotency_key"].startswith("conflict:")]


def test_a_corrected_unknown_type_runs_under_its_own_key(bus: Bus, tmp_path: Path) -> None:
    typo = bus.deliver("OR_MGTM", key="order-77", tag="typo")
    assert typo.outcome.value == "rejected"
    path = tmp_path / "fixed.json"
    fixed = {"event_type": "OR_MGMT", "entity_metadata": {
        "partnerId": "p-1", "entity_id": "order-77", "entity_type": "Order"},
        "entity_data": {"tag": "typo-fixed"}}
    path.write_text(json.dumps(fixed))
    FIXED.add("typo-fixed")
    code, _, err = bus.run("replay", typo.key, "--data", str(path))
    assert code == 0, err
    (processed,) = bus.replayed()
    assert (processed.outcome.value, processed.key) == ("processed", typo.key)
    record = bus.store.get(typo.key) or {}
    assert (record["event_status"], record["event_type"]) == ("SUCCESS", "OR_MGMT")
    assert record["rejections"][0]["event_type"] == "OR_MGTM"


def test_a_corrected_event_never_lands_in_another_partners_keys(bus: Bus,
                                                               tmp_path: Path) -> None:
    typo = bus.deliver("OR_MGTM", partner="p-1", key="order-78")
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps({"event_type": "OR_MGMT", "entity_metadata": {
        "partnerId": "p-2", "entity_id": "order-78", "entity_type": "Order"},
        "entity_data": {}}))
    code, out, _ = bus.run("replay", typo.key, "--data", str(path), "--json")
    (result,) = json.loads(out)["results"]
    assert code == 1 and result["outcome"] == "skipped" and "another partner" in result["detail"]
    assert bus.publisher.take() == []


def test_a_forged_replay_link_is_refused(bus: Bus) -> None:
    typo = bus.deliver("OR_MGTM", key="order-79")
    event = build_event("OR_MGMT", {"tag": "forged"}, entity={
        "partnerId": "p-1", "entity_id": "order-79", "entity_type": "Order"})
    body, attributes = build_message(event)
    forged = bus.redeliver(body, {**attributes, "replay_of": typo.key}, "m-forged")
    assert forged.outcome.value == "rejected" and forged.key != typo.key
    assert (bus.store.get(typo.key) or {})["event_type"] == "OR_MGTM"


@pytest.mark.parametrize("state", ["success", "in progress"])
def test_data_on_a_record_that_ran_is_refused_in_one_line(bus: Bus, tmp_path: Path,
                                                         state: str) -> None:
    done = bus.deliver(tag="ok")
    key = done.key
    if state == "in progress":
        bus.store.collection.update_one({"idempotency_key": key},
                                        {"$set": {"event_status": "PROCESSING"}})
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps({"event_type": "OR_MGMT", "entity_metadata": {
        "partnerId": "p-1", "entity_id": "x", "entity_type": "Order"}, "entity_data": {}}))
    code, out, err = bus.run("replay", key, "--data", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out
    assert bus.publisher.take() == []


def test_a_conflict_record_applies_its_payload_under_its_own_key(bus: Bus) -> None:
    first = bus.deliver(key="order-80", tag="original")
    other = bus.deliver(key="order-80", tag="conflicting")
    assert other.outcome.value == "conflict"
    [conflict] = [r for r in bus.store.find_events(EventQuery(statuses=("FAILED",)), limit=10)
                  if str(r["idempotency_key"]).startswith("conflict:")]
    FIXED.add("conflicting")
    code, _, err = bus.run("replay", conflict["idempotency_key"])
    assert code == 0, err
    (processed,) = bus.replayed()
    assert (processed.outcome.value, processed.key) == ("processed", conflict["idempotency_key"])
    assert (bus.store.get(first.key) or {})["entity_data"]["tag"] == "original"  # it stays
    applied = bus.store.get(conflict["idempotency_key"]) or {}
    assert applied["event_status"] == "SUCCESS" and applied["entity_data"]["tag"] == "conflicting"


def _ordered(bus: Bus, ts: int, key: str) -> str:
    entity = {"partnerId": "p-1", "entity_id": "pos-1", "entity_type": "Position"}
    body, attributes = build_message(build_event("POS_MGMT", {"ts": ts}, entity=entity), key=key)
    return bus.redeliver(body, attributes, f"m-{key}").outcome.value


def test_stale_events_and_an_entitys_position_are_visible_to_operators(bus: Bus) -> None:
    assert [_ordered(bus, 5, "new"), _ordered(bus, 3, "old")] == ["processed", "stale"]
    code, out, _ = bus.run("status")
    assert code == 0 and "SUCCESS(stale)" in out
    code, out, _ = bus.run("show", "p:p-1:old")
    assert code == 0 and "status:       SUCCESS(stale)" in out
    code, out, _ = bus.run("history", "--partner", "p-1")
    assert "SUCCESS(stale)" in out
    data = bus.json("entity", "p-1", "Position", "pos-1")
    assert (data["position"], data["applied_key"], data["holder"]) == (5, "p:p-1:new", None)
    assert {e["key"]: e["status"] for e in data["events"]} == {
        "p:p-1:new": "SUCCESS", "p:p-1:old": "SUCCESS(stale)"}
    code, out, _ = bus.run("entity", "p-1", "Position", "pos-1")
    assert code == 0 and "position:     5" in out and "held:         no" in out
    assert bus.run("entity", "p-1", "Position", "nobody")[0] == 1
