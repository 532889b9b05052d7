"""The publisher API and ``python -m eventbus publish`` against the emulator.

A pull subscription on a throwaway topic shows exactly what was published.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from eventbus.pubsub.publisher import Publisher
from infra.pubsub.resources import Admin
from tests.e2e.harness import E2E_PROJECT, PROJECT_ROOT, pull_now, wait_until

ENTITY = {"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"}


class Topic:
    """A throwaway topic with a pull subscription."""

    def __init__(self, admin: Admin) -> None:
        self.admin = admin
        self.name = f"pub-{uuid.uuid4().hex[:10]}"
        self.subscription = f"{self.name}-pull"

    def received(self, count: int) -> list[Any]:
        """Pull until ``count`` messages arrived; return them."""
        messages: list[Any] = []

        def enough() -> bool:
            messages.extend(pull_now(self.admin, self.subscription))
            return len(messages) >= count

        wait_until(enough, timeout=20, message=f"{count} message(s) on {self.subscription}")
        return messages


@pytest.fixture()
def topic(emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topic]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)
    with Admin(emulator, E2E_PROJECT) as admin:
        made = Topic(admin)
        admin.ensure_topic(made.name)
        admin.ensure_pull_subscription(made.subscription, made.name)
        yield made
        admin.delete_subscription(made.subscription)
        admin.delete_topic(made.name)


def test_publish_sends_the_validated_event_with_the_standard_attributes(topic: Topic) -> None:
    publisher = Publisher(E2E_PROJECT, topic.name)
    message_id = publisher.publish("OR_MGMT", {"orderId": 1}, entity=ENTITY, version="v2",
                                   idempotency_key="k-1", ordering_key="order-1")
    (received,) = topic.received(1)
    message = received.message
    assert message.message_id == message_id
    assert dict(message.attributes) == {"event_type": "OR_MGMT", "event_version": "v2",
                                        "idempotency_key": "k-1"}
    body = json.loads(message.data)
    assert body["entity_data"] == {"orderId": 1} and body["event_direction"] == "IN"
    assert body["entity_metadata"]["partnerId"] == "p1"


def test_the_publish_command_reports_each_event_and_exits_by_outcome(
        topic: Topic, emulator: str) -> None:
    specs = [{"event_type": "OR_MGMT", "entity": ENTITY, "data": {"orderId": n}}
             for n in range(3)]
    specs.insert(1, {"event_type": "OR_MGMT", "entity": {"partnerId": "p1"}})
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
           "PUBSUB_TOPIC": topic.name}
    result = subprocess.run([sys.executable, "-m", "eventbus", "publish", "-"],
                            input=json.dumps(specs), env=env, cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["#1:", "#3:", "#4:"]
    assert "event #2 not published: entity_metadata.entity_id" in result.stderr
    assert "published 3 of 4 events" in result.stderr
    assert len(topic.received(3)) == 3
    bad = subprocess.run([sys.executable, "-m", "eventbus", "publish", "-"], input="{oops",
                         env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("eventbus: - is not JSON")
