"""Pure parts of cascades: emit, links, the publisher's checks, the publish CLI.

(The partner URL setting moved to the app: tests/unit/test_app_settings.py.)
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from eventbus.guard import Guard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import InvalidEvent, PublishError
from eventbus.model.event import EntityMetadata, Event, parse_event
from eventbus.model.keys import (
    MAX_KEY_LENGTH,
    canonical_json,
    cascade_links,
    child_key,
    fingerprint,
)
from eventbus.ops import cli, specs
from eventbus.outbox.relay import outbox_message
from eventbus.pubsub.message import build_event, build_message, message_attributes
from eventbus.store.documents import entry_filter, error_document, failed_update, published_update
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher

META = EntityMetadata("p1", "order-1", "Order", "Partner One")
ENTITY = {"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"}
NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def context(key: str = "parent") -> Context:
    return Context(event=Event("OR_MGMT", "v2", "IN", META, {}), key=key, attempt=1,
                   delivery=Delivery(b"", {}), log=logging.LoggerAdapter(logging.getLogger()),
                   db=None, now=lambda: NOW, root_key="root",
                   guard=Guard(MemoryEventStore(), lease=dt.timedelta(seconds=20), now=lambda: NOW))


# --- emit ---------------------------------------------------------------------------------


def test_emit_derives_stable_keys_from_parent_type_and_index() -> None:
    first, again = context(), context()
    for ctx in (first, again):
        ctx.emit("A", {"n": 1})
        ctx.emit("B", {"n": 2}, direction="OUT", ordering_key="o-1")
    assert [c.key for c in first.children] == [c.key for c in again.children] == \
        ["parent/0:A", "parent/1:B"]
    child = first.children[1]
    assert child.event.event_direction == "OUT" and child.event.entity_metadata == META
    assert child.ordering_key == "o-1"


def test_an_outbox_entry_carries_the_event_links_and_status() -> None:
    ctx = context()
    ctx.emit("A", {"n": 1})
    entry = ctx.children[0].to_document("parent", "root", NOW)
    assert entry["idempotency_key"] == "parent/0:A" and entry["status"] == "PENDING"
    assert (entry["parent_key"], entry["root_key"], entry["created_at"]) == \
        ("parent", "root", NOW)
    # The relay serialises the stored entry into the very message the publisher builds.
    data, attributes = outbox_message(entry)
    child = ctx.children[0].event
    assert data == canonical_json(child.to_document()).encode()
    assert attributes == message_attributes(child.event_type, child.event_version, "parent/0:A",
                                             {"parent_key": "parent", "root_key": "root"})
    assert parse_event(data, attributes) == child
    assert entry["payload_fingerprint"] == fingerprint(child)


@pytest.mark.parametrize(("event_type", "data", "options"), [
    ("bad type!", {}, {}),
    ("A", {"when": NOW}, {}),
    ("A", {}, {"direction": "SIDEWAYS"}),
    ("A", {}, {"version": "2"}),
])
def test_a_child_that_could_never_be_processed_fails_the_emit(
        event_type: str, data: dict[str, Any], options: dict[str, Any]) -> None:
    ctx = context()
    with pytest.raises(ValueError, match="cannot be published"):
        ctx.emit(event_type, data, **options)
    assert ctx.children == []


def test_long_parent_keys_give_bounded_child_keys() -> None:
    key = child_key("k" * MAX_KEY_LENGTH, "A", 0)
    assert len(key) <= MAX_KEY_LENGTH and key.startswith("c:")


@pytest.mark.parametrize(("attributes", "links"), [
    ({}, {}),
    ({"parent_key": "p", "root_key": "r", "other": "x"}, {"parent_key": "p", "root_key": "r"}),
    ({"parent_key": "p" * (MAX_KEY_LENGTH + 1), "root_key": "r"}, {"root_key": "r"}),
    ({"parent_key": "bad\nkey", "root_key": ""}, {}),
])
def test_only_usable_cascade_links_are_kept(attributes: dict[str, str],
                                            links: dict[str, str]) -> None:
    assert cascade_links(attributes) == links


# --- relay updates --------------------------------------------------------------------------


def test_the_relay_marks_one_entry_by_index_and_only_while_pending() -> None:
    assert entry_filter("p", 2, "p/2:A") == {"idempotency_key": "p",
                                             "outbox.2.idempotency_key": "p/2:A",
                                             "outbox.2.status": "PENDING"}
    done = published_update(2, NOW, "m-1", 3)
    assert done["$set"] == {"outbox.2.status": "PUBLISHED", "outbox.2.published_at": NOW,
                            "outbox.2.messageId": "m-1"}
    assert done["$inc"] == {"outbox.2.publish_attempts": 3}
    failed = failed_update(2, NOW, error_document(PublishError("down"), "transient"), 4)
    assert "outbox.2.status" not in failed["$set"]
    assert failed["$set"]["outbox.2.last_error"]["message"] == "down"


# --- publisher ------------------------------------------------------------------------------


def test_build_message_sets_the_standard_attributes() -> None:
    event = build_event("OR_MGMT", {"orderId": 1}, entity=ENTITY, version="v2")
    data, attributes = build_message(event, key="k-1", extra={"parent_key": "p"})
    assert json.loads(data)["entity_metadata"]["partnerId"] == "p1"
    assert attributes == {"parent_key": "p", "event_type": "OR_MGMT", "event_version": "v2",
                          "idempotency_key": "k-1"}
    derived = build_message(event)[1]["idempotency_key"]
    assert derived.startswith("order-1:OR_MGMT:") and derived == build_message(event)[1][
        "idempotency_key"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: build_event("OR_MGMT", {}, entity={"partnerId": "p1"}), "entity_id"),
    (lambda: build_event("OR_MGMT", {}, entity=["p1"]), "entity must be an object"),  # type: ignore[arg-type]
    (lambda: build_event("OR_MGMT", [1], entity=ENTITY), "data must be an object"),  # type: ignore[arg-type]
    (lambda: build_event("OR_MGMT", {"t": NOW}, entity=ENTITY), "JSON"),
    (lambda: build_event("or mgmt", {}, entity=ENTITY), "event_type"),
    (lambda: build_message(build_event("A", {}, entity=ENTITY), key="x" * 600), "idempotency"),
    (lambda: build_message(build_event("A", {"b": "x" * 10_000_001}, entity=ENTITY)), "bytes"),
])
def test_the_publisher_refuses_what_the_receiver_would(call: Any, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        call()


# --- the publish command --------------------------------------------------------------------


def spec(**changes: Any) -> dict[str, Any]:
    return {"event_type": "OR_MGMT", "entity": ENTITY, "data": {"orderId": 1}, **changes}


@pytest.mark.parametrize(("text", "message"), [
    ("{nope", "is not JSON: Expecting property name"),
    ("[]", "empty list"),
    ('[{"event_type": "A"}, 3]', "event #2 is int, not an event object"),
])
def test_unreadable_input_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = tmp_path / "events.json"
    path.write_text(text)
    assert cli.main(["publish", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["publish", "/no/such/file.json"]) == 2
    assert "cannot read /no/such/file.json" in capsys.readouterr().err


def published(monkeypatch: pytest.MonkeyPatch, specs: Any,
              publisher: CapturingPublisher | None = None) -> CapturingPublisher:
    fake = publisher or CapturingPublisher()
    monkeypatch.setattr(cli, "publisher", lambda settings, timeout=30.0: fake)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(specs)))
    return fake


def test_invalid_events_are_reported_one_line_each_and_the_rest_published(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    specs = [spec(), {"event_type": "A"}, spec(entity={"partnerId": ""}),
             spec(idempotency_key=5), spec(ordering_key="o-1"), {"raw": "not json"}]
    fake = published(monkeypatch, specs)
    assert cli.main(["publish", "-"]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()] == ["#1:", "#5:", "#6:"]
    errors = err.splitlines()
    assert errors[0] == "eventbus: event #2 not published: missing entity"
    assert errors[1].startswith("eventbus: event #3 not published: entity_metadata.partnerId")
    assert errors[2] == \
        "eventbus: event #4 not published: idempotency_key must be a string, got int"
    assert errors[-1] == "eventbus: published 3 of 6 events to partner-events"
    assert fake.messages[1].ordering_key == "o-1" and fake.messages[2].data == b"not json"


def test_everything_published_is_exit_0_with_progress_for_many(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    published(monkeypatch, [spec(data={"orderId": n}) for n in range(250)])
    assert cli.main(["publish", "-"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["eventbus: 100/250 done, 100 published", "eventbus: 200/250 done, 200 published",
                   "eventbus: 250/250 done, 250 published",
                   "eventbus: published 250 of 250 events to partner-events"]


def test_pubsub_down_stops_after_a_few_failures_in_a_row(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = published(monkeypatch, [spec(data={"orderId": n}) for n in range(10)],
                     CapturingPublisher(failures=100))
    assert cli.main(["publish", "-"]) == 1
    err = capsys.readouterr().err
    assert fake.tries == specs.MAX_FAILURES_IN_A_ROW
    assert "3 publish failures in a row; events #4-#10 not tried" in err
