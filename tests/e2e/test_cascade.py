"""A cascade end to end: emulator → gunicorn → inline relay → emulator → … → partner.

An inbound ``OR_MGMT`` order is published to the emulator, which pushes it to
gunicorn. Its handler emits ``PARTNER_NOTIFY``; the inline relay publishes it
back to the topic; its handler calls a local partner server and emits
``PARTNER_NOTIFY_SENT``, whose handler records the notification.

The first test injects a failure at each step (``tests/e2e/cascade_app.py``
and a partner that answers 503 first) and checks that the end state is
complete and every effect happened once. The second runs without the inline
relay, which is what a crash between the commit and the publish leaves, and
recovers with the sweeper, ``python -m eventbus relay --once``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from eventbus.model.keys import child_key, record_key
from eventbus.outbox.relay import outbox_message
from eventbus.pubsub.message import build_event
from eventbus.pubsub.publisher import Publisher
from infra.pubsub.config import PushPolicy
from tests.e2e.harness import E2E_PROJECT, PROJECT_ROOT, PushRoute, ServiceProcess, wait_until
from tests.partner_server import PartnerServer

NOTIFY, SENT = "PARTNER_NOTIFY", "PARTNER_NOTIFY_SENT"
POLICY = PushPolicy(ack_deadline=60, min_backoff=1.0, max_backoff=2.0, max_delivery_attempts=0)
ORDER = {"orderId": 59734, "orderStatusLatest": "OR_CNF", "orderStatusLatestTimestamp": 1763800000}
ENTITY = {"partnerId": "partner-7", "partnerName": "Seven", "entity_id": "order-59734",
          "entity_type": "Order"}
ORDER_KEY = "e2e-order-59734:OR_CNF"  # the publisher's idempotency_key
# The order is stored under its partner-scoped key; the children's keys derive from it.
ROOT = record_key(build_event("OR_MGMT", ORDER, entity=ENTITY, version="v2"),
                  {"idempotency_key": ORDER_KEY})
NOTIFY_KEY = child_key(ROOT, NOTIFY, 0)
SENT_KEY = child_key(NOTIFY_KEY, SENT, 0)


class Bus:
    """One topic pushed to one service, with a publisher and the environment they share."""

    def __init__(self, emulator: str, route: PushRoute, env: dict[str, str]) -> None:
        self.emulator, self.route, self.env = emulator, route, env
        self.publisher = Publisher(E2E_PROJECT, route.topic)

    def point_at(self, service: ServiceProcess) -> None:
        """Send the route's pushes to ``service`` (it needed the topic before it started)."""
        self.route.admin.ensure_push_subscription(self.route.subscription, self.route.topic,
                                                  f"{service.url}/", POLICY)

    def publish_order(self) -> str:
        return self.publisher.publish("OR_MGMT", ORDER, entity=ENTITY, version="v2",
                                      idempotency_key=ORDER_KEY, ordering_key="order-59734")

    def sweep(self) -> subprocess.CompletedProcess[str]:
        """Run the sweeper once, as an operator or a scheduler would."""
        return subprocess.run([sys.executable, "-m", "eventbus", "relay", "--once", "--grace", "0"],
                              cwd=PROJECT_ROOT, env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture()
def bus(emulator: str, push_route: Callable[..., PushRoute], mongo_uri: str, mongo_db: Database,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Bus]:
    # Pushes go nowhere until point_at(); nothing is published before that.
    route = push_route(emulator, "http://127.0.0.1:9/", ack_deadline=POLICY.ack_deadline,
                       min_backoff=POLICY.min_backoff, max_backoff=POLICY.max_backoff)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)  # read by the publisher client
    env = {"MONGODB_URI": mongo_uri, "MONGODB_DB": mongo_db.name,
           "PUBSUB_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
           "PUBSUB_TOPIC": route.topic, "EVENTBUS_PARTNER_TIMEOUT_SECONDS": "5"}
    yield Bus(emulator, route, env)


def documents(db: Database) -> dict[str, dict[str, Any]]:
    found = db.partner_events.find({"idempotency_key": {"$in": [ROOT, NOTIFY_KEY, SENT_KEY]}})
    return {doc["idempotency_key"]: doc for doc in found}


def complete(db: Database) -> dict[str, dict[str, Any]] | None:
    """The three documents once the cascade is finished and its outboxes published."""
    docs = documents(db)
    done = len(docs) == 3 and all(d["event_status"] == "SUCCESS" for d in docs.values())
    published = all(e["status"] == "PUBLISHED" for d in docs.values() for e in d.get("outbox", []))
    return docs if done and published and db.partner_notifications.count_documents({}) else None


def request_lines(service: ServiceProcess, key: str) -> list[dict[str, Any]]:
    lines = []
    for line in service.log_path.read_text().splitlines():
        if line.startswith("{") and '"logType": "REQUEST_INBOUND"' in line:
            entry = json.loads(line)
            if entry.get("idempotency_key") == key:
                lines.append(entry)
    return lines


def test_a_cascade_with_a_failure_at_each_step_completes_with_every_effect_once(
        bus: Bus, service: Callable[..., ServiceProcess], mongo_db: Database,
        tmp_path: Path) -> None:
    with PartnerServer([503], then=200) as partner:
        app = service(env={**bus.env, "EVENTBUS_PARTNER_URL": partner.template,
                           "CASCADE_FAULTS": str(tmp_path)}, app="tests.e2e.cascade_app:app")
        bus.point_at(app)
        bus.publish_order()
        docs = wait_until(lambda: complete(mongo_db), timeout=60, interval=0.25,
                          message="the cascade to complete")
        # Each fault fired, and each step was retried past it.
        assert (tmp_path / "relay-publish").exists()
        assert docs[ROOT]["outbox"][0]["publish_attempts"] == 2
        assert docs[NOTIFY_KEY]["attempts"] == 2 and docs[SENT_KEY]["attempts"] == 2
        # Every effect happened exactly once.
        assert [call.status for call in partner.calls] == [503, 200]
        assert partner.successes() == {NOTIFY_KEY: 1}
        assert partner.calls[1].path == "/partners/partner-7/events"
        # The guarded partner call: failed once (503, transient), then set for good.
        call = mongo_db.side_effects.find_one({"_id": NOTIFY_KEY})
        assert call is not None and call["status"] == "SUCCESS" and call["attempts"] == 2
        assert call["result"]["status_code"] == 200 and "error" not in call
        assert mongo_db.partner_notifications.count_documents({}) == 1
        assert mongo_db.order_projection.find_one()["eventsApplied"] == 1
        # The links lead back to the source.
        assert docs[SENT_KEY]["parent_key"] == NOTIFY_KEY
        assert docs[SENT_KEY]["root_key"] == docs[NOTIFY_KEY]["root_key"] == ROOT
        # A child published again (a relay retry whose answer was lost) is harmless:
        # the same message the relay sends, with its key and cascade links.
        data, attributes = outbox_message(docs[ROOT]["outbox"][0])
        assert attributes["idempotency_key"] == NOTIFY_KEY
        bus.publisher.publish_message(data, attributes)
        wait_until(lambda: any(line["outcome"] == "duplicate"
                               for line in request_lines(app, NOTIFY_KEY)),
                   timeout=30, message="the republished child to be acked as a duplicate")
        assert partner.successes() == {NOTIFY_KEY: 1}


def test_a_crash_between_commit_and_publish_is_recovered_by_the_sweeper(
        bus: Bus, service: Callable[..., ServiceProcess], mongo_db: Database) -> None:
    with PartnerServer() as partner:
        # No inline relay: every parent is committed and nothing publishes its
        # children, exactly what a crash right after the commit leaves.
        app = service(env={**bus.env, "EVENTBUS_PARTNER_URL": partner.template,
                           "EVENTBUS_RELAY_INLINE": "false"})
        bus.point_at(app)
        bus.publish_order()
        root = wait_until(lambda: documents(mongo_db).get(ROOT), timeout=30,
                          message="the order to be processed")
        wait_until(lambda: documents(mongo_db)[ROOT]["event_status"] == "SUCCESS", timeout=30)
        # The child, and the order's two forwards to its public topic (handlers/public.py).
        outbox = documents(mongo_db)[ROOT]["outbox"]
        assert [(e.get("kind"), e["status"]) for e in outbox] == [
            (None, "PENDING"), ("public", "PENDING"), ("public", "PENDING")]
        assert root["idempotency_key"] == ROOT and NOTIFY_KEY not in documents(mongo_db)
        sweeps: list[subprocess.CompletedProcess[str]] = []

        def swept() -> dict[str, dict[str, Any]] | None:
            sweeps.append(bus.sweep())
            assert sweeps[-1].returncode == 0, sweeps[-1].stderr
            return complete(mongo_db)

        wait_until(swept, timeout=90, interval=0.5, message="the sweeper to finish the cascade")
        assert "published 3" in sweeps[0].stdout  # the child and the two forwards
        assert partner.successes() == {NOTIFY_KEY: 1}
        assert mongo_db.partner_notifications.count_documents({}) == 1
        call = mongo_db.side_effects.find_one({"_id": NOTIFY_KEY})
        assert call is not None and (call["status"], call["attempts"]) == ("SUCCESS", 1)
        assert call["result"]["status_code"] == 200
