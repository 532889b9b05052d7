"""A partner down, then back, through the emulator: its events are parked, then each arrives once.

Orders for two partners are published to the emulator, which pushes them to
gunicorn (``main:app``, the partner app). Each order's ``PARTNER_NOTIFY``
child calls a local partner server through the partner's breaker. While
``partner-down`` answers 503 its breaker opens and its notifications are
parked and acked (no 503 loop: the emulator strands nacked messages, see
DESIGN.md). Then it recovers, and the store-driven redrive
(``python -m eventbus redrive --once``, run as a scheduler would) brings
every parked notification back: each is delivered exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pymongo.database import Database

from eventbus.pubsub.publisher import Publisher
from infra.pubsub.config import PushPolicy
from tests.e2e.harness import E2E_PROJECT, PROJECT_ROOT, PushRoute, ServiceProcess, wait_until

DOWN, UP = "partner-down", "partner-up"
POLICY = PushPolicy(ack_deadline=60, min_backoff=1.0, max_backoff=2.0, max_delivery_attempts=0)


class Partners:
    """Partner endpoints at ``/partners/<id>/events``; ids in ``down`` answer 503."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.calls: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)

    @property
    def template(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/partners/{{partnerId}}/events"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        partners = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                partner = self.path.split("/")[2]
                status = 503 if partner in partners.down else 200
                with partners.lock:
                    partners.calls.append((partner, self.headers["Idempotency-Key"], status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        return Handler

    def delivered(self, partner: str) -> collections.Counter[str]:
        """2xx answers per ``Idempotency-Key`` of ``partner``."""
        return collections.Counter(key for who, key, status in self.calls
                                   if who == partner and status < 300)

    def failed_calls(self, partner: str) -> int:
        return sum(1 for who, _, status in self.calls if who == partner and status >= 300)

    def __enter__(self) -> Partners:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def route(emulator: str, push_route: Callable[..., PushRoute],
          monkeypatch: pytest.MonkeyPatch) -> Iterator[PushRoute]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)  # read by the publisher client
    yield push_route(emulator, "http://127.0.0.1:9/", ack_deadline=POLICY.ack_deadline,
                     min_backoff=POLICY.min_backoff, max_backoff=POLICY.max_backoff)


def notifications(db: Database, partner: str) -> list[dict[str, Any]]:
    return list(db.partner_events.find({"event_type": "PARTNER_NOTIFY",
                                        "entity_metadata.partnerId": partner}))


def outcomes(service: ServiceProcess, keys: set[str]) -> list[tuple[int, str]]:
    found = []
    for line in service.log_path.read_text().splitlines():
        if line.startswith("{") and '"logType": "REQUEST_INBOUND"' in line:
            entry = json.loads(line)
            if entry.get("idempotency_key") in keys:
                found.append((entry["status"], entry["outcome"]))
    return found


def test_a_down_partner_is_parked_then_each_of_its_events_is_delivered_once(
        route: PushRoute, emulator: str, service: Callable[..., ServiceProcess],
        mongo_uri: str, mongo_db: Database) -> None:
    env = {"MONGODB_URI": mongo_uri, "MONGODB_DB": mongo_db.name,
           "PUBSUB_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
           "PUBSUB_TOPIC": route.topic, "EVENTBUS_PARTNER_TIMEOUT_SECONDS": "5",
           "EVENTBUS_BREAKER_FAILURES": "2", "EVENTBUS_BREAKER_OPEN_SECONDS": "2",
           "EVENTBUS_BREAKER_PROBE_SECONDS": "5", "EVENTBUS_REDRIVE_AFTER_SECONDS": "2"}
    with Partners() as partners:
        partners.down.add(DOWN)
        app = service(env={**env, "EVENTBUS_PARTNER_URL": partners.template})
        route.admin.ensure_push_subscription(route.subscription, route.topic, f"{app.url}/",
                                             POLICY)
        publisher = Publisher(E2E_PROJECT, route.topic)
        orders = [(DOWN, n) for n in range(5)] + [(UP, n) for n in range(2)]
        for partner, n in orders:
            publisher.publish("OR_MGMT", {"orderId": 1000 + n, "orderStatusLatest": "OR_CNF",
                                          "orderStatusLatestTimestamp": 1763800000 + n},
                              entity={"partnerId": partner, "partnerName": partner,
                                      "entity_id": f"order-{partner}-{n}",
                                      "entity_type": "Order"},
                              version="v2", idempotency_key=f"{partner}-{n}")

        def parked_and_others_done() -> bool:
            down = notifications(mongo_db, DOWN)
            up_done = mongo_db.partner_notifications.count_documents({"partnerId": UP}) == 2
            return up_done and len(down) == 5 and all(
                doc["event_status"] == "FAILED" and doc.get("retryable") for doc in down)

        wait_until(parked_and_others_done, timeout=60, interval=0.25,
                   message="the healthy partner's notifications and the other's parked")
        down_keys = {doc["idempotency_key"] for doc in notifications(mongo_db, DOWN)}
        answers = outcomes(app, down_keys)
        assert ("parked" in {outcome for _, outcome in answers}
                and sum(status == 503 for status, _ in answers) <= 2), answers
        assert partners.failed_calls(DOWN) <= 3  # two to open it, at most one probe
        assert partners.delivered(UP) and max(partners.delivered(UP).values()) == 1

        partners.down.clear()  # the partner is back
        redrives: list[subprocess.CompletedProcess[str]] = []

        def redriven() -> bool:
            redrives.append(subprocess.run(
                [sys.executable, "-m", "eventbus", "redrive", "--once", "--app", "main:app"],
                cwd=PROJECT_ROOT, env={**os.environ, **env, "EVENTBUS_PARTNER_URL":
                                       partners.template},
                capture_output=True, text=True, timeout=120, check=False))
            assert redrives[-1].returncode == 0, redrives[-1].stderr
            return mongo_db.partner_notifications.count_documents({"partnerId": DOWN}) == 5

        wait_until(redriven, timeout=120, interval=1.0,
                   message="every parked notification to be delivered")
        assert partners.delivered(DOWN) == {key: 1 for key in down_keys}
        assert all(doc["event_status"] == "SUCCESS" for doc in notifications(mongo_db, DOWN))
        assert mongo_db.partner_notifications.count_documents({}) == 7
