"""Public topics end to end: emulator → gunicorn (``main:app``) → relay → ``order-status``.

The partner app forwards shipped (and confirmed, delivered, cancelled) orders
to the public topic ``order-status`` as contract ``v1`` and ``v2``
(``handlers/public.py``). Each test subscribes to the public topic itself
(a subscription holds only what is published after it exists) and looks only
at its own keys.

* An order processed gives exactly one message per contract version, in the
  public shape, carrying the order's key; a duplicate delivery and an
  operator replay forward nothing new; a placed order and a subscription
  event never appear there.
* With the inline relay off (what a crash between SUCCESS and the publish
  leaves), nothing is forwarded until the sweeper (``eventbus relay --once``)
  runs; then exactly one message per version, and a second sweep adds none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo.database import Database

from eventbus.model.keys import record_key
from eventbus.pubsub.message import build_event
from eventbus.pubsub.publisher import Publisher
from infra.pubsub.config import PushPolicy
from infra.pubsub.resources import Admin
from tests.e2e.harness import (
    E2E_PROJECT,
    PROJECT_ROOT,
    PushRoute,
    ServiceProcess,
    pull_now,
    wait_until,
)

# An empty subscription holds peek's pull for --wait seconds (default 10): 2 is ample on
# the emulator, which answers a pull at once when something is waiting.
PEEK_WAIT = ("--wait", "2")
POLICY = PushPolicy(ack_deadline=60, min_backoff=1.0, max_backoff=2.0, max_delivery_attempts=0)
ENTITY = {"partnerId": "partner-pub", "partnerName": "Pub", "entity_id": "order-1",
          "entity_type": "Order"}


def order(status: str, order_id: int) -> dict[str, Any]:
    return {"orderId": order_id, "orderStatusLatest": status,
            "orderStatusLatestTimestamp": 1763800000, "orderLineItems": [{"sku": "a"}]}


class Public:
    """The bus topic pushed to one service, and a subscription of our own on the public topic."""

    def __init__(self, emulator: str, route: PushRoute, env: dict[str, str]) -> None:
        self.route, self.env = route, env
        self.admin = Admin(emulator, E2E_PROJECT)
        self.subscription = f"order-status-e2e-{uuid.uuid4().hex[:8]}"
        self.admin.ensure_pull_subscription(self.subscription, "order-status")
        self.publisher = Publisher(E2E_PROJECT, route.topic)
        self.seen: list[Any] = []

    def point_at(self, service: ServiceProcess) -> None:
        self.route.admin.ensure_push_subscription(self.route.subscription, self.route.topic,
                                                  f"{service.url}/", POLICY)

    def publish(self, event_type: str, data: dict[str, Any], key: str) -> str:
        """Publish to the bus; return the key the record is stored under."""
        self.publisher.publish(event_type, data, entity=ENTITY, version="v2",
                               idempotency_key=key)
        return record_key(build_event(event_type, data, entity=ENTITY, version="v2"),
                          {"idempotency_key": key})

    def arrived(self, settle: float = 2.0) -> list[Any]:
        """Everything on our public subscription so far (pulled until ``settle`` s of quiet)."""
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < settle:
            got = pull_now(self.admin, self.subscription, 100)
            if got:
                self.seen += got
                quiet_since = time.monotonic()
            else:
                time.sleep(0.2)
        return self.seen

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "eventbus", *args], cwd=PROJECT_ROOT,
                              env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=120, check=False)

    def close(self) -> None:
        self.admin.delete_subscription(self.subscription)
        self.admin.close()


@pytest.fixture()
def public(emulator: str, push_route: Callable[..., PushRoute], mongo_uri: str,
           mongo_db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[Public]:
    route = push_route(emulator, "http://127.0.0.1:9/", ack_deadline=POLICY.ack_deadline,
                       min_backoff=POLICY.min_backoff, max_backoff=POLICY.max_backoff)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)
    env = {"MONGODB_URI": mongo_uri, "MONGODB_DB": mongo_db.name,
           "PUBSUB_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
           "PUBSUB_TOPIC": route.topic, "EVENTBUS_PARTNER_URL": "http://127.0.0.1:9/{partnerId}",
           "EVENTBUS_PARTNER_TIMEOUT_SECONDS": "1"}
    made = Public(emulator, route, env)
    yield made
    made.close()


def forwards_published(db: Database, key: str) -> bool:
    record = db.partner_events.find_one({"idempotency_key": key}) or {}
    entries = [e for e in record.get("outbox", []) if e.get("kind") == "public"]
    return record.get("event_status") == "SUCCESS" and len(entries) == 2 and \
        all(e["status"] == "PUBLISHED" for e in entries)


def of(messages: list[Any], key: str) -> list[Any]:
    return [m for m in messages if m.message.attributes.get("idempotency_key") == key]


def test_an_order_is_forwarded_once_per_version_and_nothing_else_appears(
        public: Public, service: Callable[..., ServiceProcess], mongo_db: Database) -> None:
    app = service(env=public.env)
    public.point_at(app)
    shipped = public.publish("OR_MGMT", order("OR_SHP", 1), "pub-e2e-1")
    placed = public.publish("OR_MGMT", order("OR_PLC", 2), "pub-e2e-2")
    wait_until(lambda: forwards_published(mongo_db, shipped), timeout=60, interval=0.25)
    wait_until(lambda: mongo_db.partner_events.find_one(
        {"idempotency_key": placed, "event_status": "SUCCESS"}), timeout=60)
    messages = of(public.arrived(), shipped)
    assert sorted(m.message.attributes["contract_version"] for m in messages) == ["v1", "v2"]
    v1 = next(m for m in messages if m.message.attributes["contract_version"] == "v1")
    assert json.loads(v1.message.data) == {"version": "v1", "order_id": "1",
                                           "partner_id": "partner-pub", "status": "OR_SHP",
                                           "changed_at": 1763800000}
    assert "event_type" not in v1.message.attributes
    assert of(public.seen, placed) == []

    public.publish("OR_MGMT", order("OR_SHP", 1), "pub-e2e-1")  # a duplicate: new message id
    wait_until(lambda: (mongo_db.partner_events.find_one({"idempotency_key": shipped}) or {})
               .get("duplicates", 0) >= 1 or _logged_duplicate(app, shipped), timeout=30)
    replay = public.command("replay", shipped, "--yes")  # refused: the event succeeded
    assert "not FAILED: not replayed" in replay.stderr, replay.stdout + replay.stderr
    assert len(of(public.arrived(settle=4.0), shipped)) == 2
    assert {m.message.attributes.get("idempotency_key") for m in public.seen} == {shipped}


def _logged_duplicate(app: ServiceProcess, key: str) -> bool:
    for line in app.log_path.read_text().splitlines():
        if '"outcome": "duplicate"' in line and key in line:
            return True
    return False


def test_a_crash_before_the_publish_is_forwarded_by_the_sweeper_exactly_once(
        public: Public, service: Callable[..., ServiceProcess], mongo_db: Database) -> None:
    app = service(env={**public.env, "EVENTBUS_RELAY_INLINE": "false"})
    public.point_at(app)
    key = public.publish("OR_MGMT", order("OR_DLV", 3), "pub-e2e-3")
    wait_until(lambda: mongo_db.partner_events.find_one(
        {"idempotency_key": key, "event_status": "SUCCESS"}), timeout=60)
    assert of(public.arrived(), key) == []
    for _ in range(2):
        swept = public.command("relay", "--once", "--grace", "0")
        assert swept.returncode == 0, swept.stdout + swept.stderr
    assert forwards_published(mongo_db, key)
    peeked = wait_until(lambda: _peek(public, key), timeout=20, message="peek to show them")
    assert "v1" in peeked and "v2" in peeked and '"status":"OR_DLV"' in peeked
    messages = of(public.arrived(), key)  # peek handed them back: they are still there
    assert sorted(m.message.attributes["contract_version"] for m in messages) == ["v1", "v2"]
    assert json.loads(messages[0].message.data)["status"] == "OR_DLV"
    empty = public.command("peek", "order-status", "--subscription", public.subscription,
                          *PEEK_WAIT)
    assert empty.returncode == 0 and "nothing waiting" in empty.stdout


def _peek(public: Public, key: str) -> str | None:
    """``eventbus peek`` on our subscription, when it shows both versions of ``key``."""
    shown = public.command("peek", "order-status", "--subscription", public.subscription,
                          "--wide", *PEEK_WAIT)  # the whole bodies: a table cuts them
    assert shown.returncode == 0, shown.stderr
    return shown.stdout if shown.stdout.count(key) >= 2 else None
