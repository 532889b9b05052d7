"""Per-entity order end to end: an ordered pull subscription, the real worker, the partner app.

Each of 20 orders gets 5 status events (``OR_MGMT`` is ordered by
``orderStatusLatestTimestamp``), published with the order as ordering key but
in a scrambled order, plus a late retry of the oldest. The emulator does not
honour ordering keys (DESIGN.md), so the worker sees them out of order: the
store's position must still make the newest win. Then each order's projection
shows its newest status, its history never went backwards, every event is
stored (applied or stale), and the stale ones never ran.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.pubsub_v1 import types
from pymongo.database import Database

from infra.pubsub.resources import Admin
from tests.e2e.harness import E2E_PROJECT, log_tail, wait_until
from tests.e2e.test_pull_e2e import Worker
from tests.partner_server import PartnerServer

ORDERS, STATUSES = 20, 5
ENTITY = {"partnerId": "p-order", "partnerName": "Order Partner", "entity_type": "Order"}


def status_event(order: int, step: int) -> types.PubsubMessage:
    body = {"event_type": "OR_MGMT", "event_version": "v2",
            "entity_metadata": {**ENTITY, "entity_id": f"o-{order}"},
            "entity_data": {"orderId": order, "orderStatusLatest": "OR_PLC",
                            "orderStatusLatestTimestamp": 1764000000 + step}}
    return types.PubsubMessage(data=json.dumps(body).encode(),
                               attributes={"idempotency_key": f"o-{order}-{step}"},
                               ordering_key=f"o-{order}")


@pytest.fixture()
def ordered_topic(emulator: str) -> Iterator[tuple[Admin, str, str]]:
    admin = Admin(emulator, E2E_PROJECT)
    topic = f"e2e-order-{uuid.uuid4().hex[:8]}"
    admin.ensure_topic(topic)
    admin.subscriber.create_subscription(request=types.Subscription(
        name=admin.subscription_path(f"{topic}-pull"), topic=admin.topic_path(topic),
        ack_deadline_seconds=10, enable_message_ordering=True))
    yield admin, topic, f"{topic}-pull"
    admin.delete_subscription(f"{topic}-pull")
    admin.delete_topic(topic)
    admin.close()


def test_scrambled_status_events_leave_each_order_at_its_newest(
        ordered_topic: tuple[Admin, str, str], mongo_uri: str, mongo_db: Database,
        tmp_path: Path) -> None:
    admin, topic, subscription = ordered_topic
    scrambled = [(order, step) for order in range(ORDERS) for step in range(STATUSES)]
    random.Random(7).shuffle(scrambled)
    batch = [status_event(o, s) for o, s in scrambled] + [status_event(0, 0)]  # a late retry
    admin.publisher.publish(topic=admin.topic_path(topic), messages=batch, timeout=30)
    with PartnerServer() as partner:
        env = {**os.environ, "MONGODB_URI": mongo_uri, "MONGODB_DB": mongo_db.name,
               "PUBSUB_EMULATOR_HOST": admin.host, "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
               "PUBSUB_TOPIC": topic, "EVENTBUS_PULL_SUBSCRIPTION": subscription,
               "EVENTBUS_PARTNER_URL": partner.template, "LOG_LEVEL": "WARNING"}
        worker = Worker(env, tmp_path / "worker.log")
        try:
            worker.start()
            wait_until(lambda: stored(mongo_db) >= ORDERS * STATUSES, 120,
                       message=log_tail(worker.log))
        finally:
            worker.stop()
    newest = 1764000000 + STATUSES - 1
    for projection in mongo_db.order_projection.find():
        assert projection["asOf"] == newest, projection["_id"]
        seen = [change["asOf"] for change in projection["history"]]
        assert seen == sorted(seen) and len(set(seen)) == len(seen)  # never backwards, once
    assert mongo_db.order_projection.count_documents({}) == ORDERS
    stale = mongo_db.partner_events.count_documents({"stale": {"$exists": True}})
    applied = sum(p["eventsApplied"] for p in mongo_db.order_projection.find())
    assert applied + stale == ORDERS * STATUSES  # each event applied once or stale, none lost
    entities = list(mongo_db.partner_events.find({"record_type": "entity"}))
    assert len(entities) == ORDERS and {e["position"] for e in entities} == {newest}


def stored(db: Database) -> int:
    return db.partner_events.count_documents({"event_type": "OR_MGMT",
                                              "event_status": "SUCCESS"})
