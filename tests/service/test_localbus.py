"""``eventbus.testing.LocalBus`` with the app's real router: a whole cascade in-process.

No server, no Flask: the bus runs the processor and the relay synchronously on
the in-memory store; the handlers write to a mongomock database and call the
scripted partner server (``tests/partner_server.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eventbus.model.keys import child_key
from eventbus.model.outcome import Outcome
from eventbus.testing import LocalBus
from handlers.notifications import NOTIFY, SENT
from tests.partner_server import PartnerServer
from tests.service.conftest import app_router, memory_database

ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "order-59734",
          "entity_type": "Order"}
CONFIRMED = {"orderId": 59734, "orderStatusLatest": "OR_CNF",
             "orderStatusLatestTimestamp": 1655292804}


@pytest.fixture()
def partner() -> Iterator[PartnerServer]:
    with PartnerServer() as server:
        yield server


@pytest.fixture()
def bus(partner: PartnerServer) -> Iterator[LocalBus]:
    with LocalBus(app_router(partner.template), database=memory_database()) as bus:
        yield bus


def test_a_confirmed_order_runs_the_whole_cascade_in_process(
        bus: LocalBus, partner: PartnerServer) -> None:
    root = bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    notify = child_key(root, NOTIFY, 0)
    sent = child_key(notify, SENT, 0)
    assert [(r.outcome, r.key) for r in bus.results] == [
        (Outcome.PROCESSED, root), (Outcome.PROCESSED, notify), (Outcome.PROCESSED, sent)]
    for key in (root, notify, sent):
        record = bus.record(key)
        assert record is not None and record["event_status"] == "SUCCESS", key
    assert bus.record(sent)["parent_key"] == notify and bus.record(sent)["root_key"] == root
    (call,) = partner.calls
    assert call.path == "/partners/p1/events" and call.key == notify
    assert call.body["payload"] == {"orderId": 59734, "status": "OR_CNF", "asOf": 1655292804}
    database = bus.store.database
    (notification,) = database.partner_notifications.find()
    assert notification["_id"] == notify and notification["statusCode"] == 200
    order = database.order_projection.find_one({"_id": "p1:59734"})
    assert order["status"] == "OR_CNF" and order["eventsApplied"] == 1
    guard = bus.store.guard_get(notify)
    assert guard is not None and guard["status"] == "SUCCESS"
    assert guard["result"]["status_code"] == 200


def test_publishing_the_same_event_again_is_a_duplicate_with_no_second_call(
        bus: LocalBus, partner: PartnerServer) -> None:
    first = bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    ran = len(bus.results)
    again = bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    assert again == first
    (duplicate,) = bus.results[ran:]
    assert (duplicate.outcome, duplicate.key) == (Outcome.DUPLICATE, first)
    assert len(partner.calls) == 1
    assert bus.store.database.partner_notifications.count_documents({}) == 1
    # A redelivered child is a duplicate too: the partner is not called again.
    assert bus.redeliver(child_key(first, NOTIFY, 0)).outcome is Outcome.DUPLICATE
    assert len(partner.calls) == 1


def test_the_cascade_view_shows_the_tree(bus: LocalBus) -> None:
    root = bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    notify = child_key(root, NOTIFY, 0)
    sent = child_key(notify, SENT, 0)
    lines = bus.cascade(notify).splitlines()
    assert len(lines) == 3
    assert lines[0] == f"OR_MGMT  SUCCESS  {root}"
    assert lines[1].startswith(f"└─ {NOTIFY}  SUCCESS  {notify}  [published ")
    assert lines[1].endswith("messageId msg-2]  <--")
    assert lines[2].startswith(f"   └─ {SENT}  SUCCESS  {sent}  [published ")
    assert bus.cascade("unknown") == ""
