"""``python -m eventbus trace KEY``: the cascade from its root, with statuses."""

from __future__ import annotations

import datetime as dt

import pytest
from pymongo.database import Database

from eventbus import cli, trace
from eventbus.context import Child
from eventbus.event import EntityMetadata, Event
from eventbus.keys import child_key
from eventbus.relay import published_update
from eventbus.store import MongoEventStore

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
META = EntityMetadata("p1", "order-1", "Order")
ROOT = "order-1:OR_MGMT:abc"
NOTIFY = child_key(ROOT, "PARTNER_NOTIFY", 0)
SENT = child_key(NOTIFY, "PARTNER_NOTIFY_SENT", 0)


def stored(store: MongoEventStore, key: str, event_type: str, children: list[str],
           **links: str) -> None:
    claim = store.claim(key, {"event_type": event_type, **links}, NOW)
    outbox = [Child(child, Event(child.rsplit(":", 1)[1], "v1", "OUT", META, {}))
              .to_document(key, links.get("root_key", key), NOW) for child in children]
    store.succeed(key, claim.owner, NOW, outbox)


@pytest.fixture()
def cascade(mongo_db: Database) -> MongoEventStore:
    """OR_MGMT → PARTNER_NOTIFY (published, SUCCESS) → PARTNER_NOTIFY_SENT (pending)."""
    store = MongoEventStore(mongo_db.partner_events, created_by="test",
                            retention=dt.timedelta(days=1), lease=dt.timedelta(seconds=30))
    stored(store, ROOT, "OR_MGMT", [NOTIFY])
    store.collection.update_one({"idempotency_key": ROOT}, published_update(0, NOW, "m-7", 1))
    stored(store, NOTIFY, "PARTNER_NOTIFY", [SENT], parent_key=ROOT, root_key=ROOT)
    return store


def test_any_key_of_a_cascade_loads_the_whole_tree(cascade: MongoEventStore) -> None:
    for key in (ROOT, NOTIFY):
        tree = trace.load(cascade.collection, key)
        assert tree is not None and tree.key == ROOT
        (notify,) = tree.children
        (sent,) = notify.children
        assert (notify.key, notify.status, notify.entry["status"]) == \
            (NOTIFY, "SUCCESS", "PUBLISHED")
        assert (sent.key, sent.status, sent.entry["status"]) == (SENT, "NOT RECEIVED", "PENDING")
    assert trace.load(cascade.collection, "nope") is None


def test_the_cli_prints_the_tree_and_marks_the_key(
        cascade: MongoEventStore, monkeypatch: pytest.MonkeyPatch, mongo_uri: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    monkeypatch.setenv("MONGODB_DB", cascade.database.name)
    assert cli.main(["trace", NOTIFY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"OR_MGMT  SUCCESS  {ROOT}"
    assert lines[1].startswith(f"└─ PARTNER_NOTIFY  SUCCESS  {NOTIFY}  [published ")
    assert lines[1].endswith("messageId m-7]  <--")
    assert lines[2] == (f"   └─ PARTNER_NOTIFY_SENT  NOT RECEIVED  {SENT}  "
                        "[outbox PENDING, 0 publish attempts]")
    assert cli.main(["trace", "unknown-key"]) == 1
    assert "no event with idempotency key 'unknown-key'" in capsys.readouterr().err


def test_a_failed_step_shows_its_error() -> None:
    node = trace.Node("k", "PARTNER_NOTIFY", "FAILED (retrying)", error="partner answered 503")
    root = trace.Node("r", "OR_MGMT", "SUCCESS", children=[node])
    assert trace.render(root).splitlines() == [
        "OR_MGMT  SUCCESS  r", "└─ PARTNER_NOTIFY  FAILED (retrying)  k",
        "       error: partner answered 503"]
