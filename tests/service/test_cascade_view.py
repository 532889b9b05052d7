"""The cascade view (``eventbus trace KEY``) and the status table, on the in-memory store.

``eventbus.ops.cascade.load(store, key)`` walks a cascade from its root with
each event's status; ``render`` prints it as ``eventbus trace`` does, and
``eventbus.ops.progress.status_table(store)`` is what ``eventbus status`` prints.
"""

from __future__ import annotations

import datetime as dt

import pytest

from eventbus.model.context import Child
from eventbus.model.errors import PermanentError
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import child_key
from eventbus.ops import cascade as trace
from eventbus.ops import cli
from eventbus.ops.progress import status_table
from eventbus.store.base import OutboxEntry
from eventbus.store.documents import error_document
from eventbus.store.memory import MemoryEventStore

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
META = EntityMetadata("p1", "order-1", "Order")
ROOT = "order-1:OR_MGMT:abc"
NOTIFY = child_key(ROOT, "PARTNER_NOTIFY", 0)
SENT = child_key(NOTIFY, "PARTNER_NOTIFY_SENT", 0)


def stored(store: MemoryEventStore, key: str, event_type: str, children: list[str],
           **links: str) -> list[dict]:
    claim = store.claim(key, {"event_type": event_type, **links}, NOW)
    outbox = [Child(child, Event(child.rsplit(":", 1)[1], "v1", "OUT", META, {}))
              .to_document(key, links.get("root_key", key), NOW) for child in children]
    store.succeed(key, claim.owner, NOW, outbox)
    return outbox


@pytest.fixture()
def cascade() -> MemoryEventStore:
    """OR_MGMT → PARTNER_NOTIFY (published, SUCCESS) → PARTNER_NOTIFY_SENT (pending)."""
    store = MemoryEventStore(created_by="test", retention=dt.timedelta(days=1),
                             lease=dt.timedelta(seconds=30))
    (entry,) = stored(store, ROOT, "OR_MGMT", [NOTIFY])
    assert store.mark_published(OutboxEntry(ROOT, 0, entry), NOW, "m-7", 1)
    stored(store, NOTIFY, "PARTNER_NOTIFY", [SENT], parent_key=ROOT, root_key=ROOT)
    return store


def test_any_key_of_a_cascade_loads_the_whole_tree(cascade: MemoryEventStore) -> None:
    for key in (ROOT, NOTIFY):
        tree = trace.load(cascade, key)
        assert tree is not None and tree.key == ROOT
        (notify,) = tree.children
        (sent,) = notify.children
        assert (notify.key, notify.status, notify.entry["status"]) == \
            (NOTIFY, "SUCCESS", "PUBLISHED")
        assert (sent.key, sent.status, sent.entry["status"]) == (SENT, "NOT RECEIVED", "PENDING")
    assert trace.load(cascade, "nope") is None


def test_the_cli_prints_the_tree_and_marks_the_key(
        cascade: MemoryEventStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # ``eventbus trace`` on this store instead of the MongoDB store of the settings.
    monkeypatch.setattr(cli, "open_store", lambda settings: cascade)
    assert cli.main(["trace", NOTIFY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"OR_MGMT  SUCCESS  {ROOT}"
    assert lines[1].startswith(f"└─ PARTNER_NOTIFY  SUCCESS  {NOTIFY}  [published ")
    assert lines[1].endswith("messageId m-7]  <--")
    assert lines[2] == (f"   └─ PARTNER_NOTIFY_SENT  NOT RECEIVED  {SENT}  "
                        "[outbox PENDING, 0 publish attempts]")
    tree = trace.load(cascade, NOTIFY)
    assert tree is not None and trace.render(tree, marked=NOTIFY).splitlines() == lines
    assert cli.main(["trace", "unknown-key"]) == 1
    assert "no event with idempotency key 'unknown-key'" in capsys.readouterr().err


def test_a_failed_step_shows_its_error() -> None:
    node = trace.Node("k", "PARTNER_NOTIFY", "FAILED (retrying)", error="partner answered 503")
    root = trace.Node("r", "OR_MGMT", "SUCCESS", children=[node])
    assert trace.render(root).splitlines() == [
        "OR_MGMT  SUCCESS  r", "└─ PARTNER_NOTIFY  FAILED (retrying)  k",
        "       error: partner answered 503"]


def test_a_stored_failure_is_loaded_with_its_error(cascade: MemoryEventStore) -> None:
    claim = cascade.claim(SENT, {"event_type": "PARTNER_NOTIFY_SENT", "parent_key": NOTIFY,
                                 "root_key": ROOT}, NOW)
    cascade.fail(SENT, claim.owner, NOW, error_document(PermanentError("no such partner"),
                                                        "permanent"), retryable=False)
    tree = trace.load(cascade, SENT)
    assert tree is not None
    (sent,) = tree.children[0].children
    assert (sent.status, sent.error) == ("FAILED (for good)", "no such partner")
    assert trace.render(tree).splitlines()[-1] == "          error: no such partner"


def test_the_status_table_counts_events_by_type_and_status(cascade: MemoryEventStore) -> None:
    claim = cascade.claim("o-2", {"event_type": "OR_MGMT"}, NOW)
    cascade.fail("o-2", claim.owner, NOW, error_document(ConnectionError("partner down"),
                                                         "transient"), retryable=True)
    lines = status_table(cascade).splitlines()
    del lines[1]  # the rule under the headers
    assert lines[0].split() == ["event_type", "FAILED(retrying)", "SUCCESS", "total"]
    assert lines[1].split() == ["OR_MGMT", "1", "1", "2"]
    assert lines[2].split() == ["PARTNER_NOTIFY", "0", "1", "1"]
    assert lines[3] == "  FAILED o-2: partner down"
    assert len(lines) == 4
    # Restricted to one cascade: its root and every event that names it as root.
    only = status_table(cascade, [ROOT]).splitlines()
    del only[1]
    assert [line.split()[0] for line in only] == ["event_type", "OR_MGMT", "PARTNER_NOTIFY"]
    assert only[0].split() == ["event_type", "SUCCESS", "total"]
