"""pubsub-emulator.sh for real: start, idempotent re-start, push bodies, redelivery, stop.

One emulator serves the module (isolated home, free port); tests that need
their own resources use their own PUBSUB_TOPIC on it. ``UPDATE_GOLDEN=1``
rewrites tests/payloads/emulator_wrapped_push.json from a real push.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.pubsub.config import PushPolicy
from infra.pubsub.resources import Admin
from tests.e2e.harness import (
    PROJECT_ROOT,
    EmulatorScript,
    Push,
    Receiver,
    emulator_prerequisites,
    emulator_processes,
    free_port,
    start_emulator,
    unavailable,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.same_worker(
        reason="its tests share the one emulator the module starts with the script "
        "and re-run `start` on it in turn"
    ),
]

GOLDEN = PROJECT_ROOT / "tests" / "payloads" / "emulator_wrapped_push.json"
DEFAULT_NAMES = {
    "partner-events": "topic",
    "partner-events-dlq": "topic",
    "partner-events-push": "push subscription",
    "partner-events-pull": "pull subscription",
    "partner-events-dlq-pull": "pull subscription",
    # The app's public topic (docs/contracts/topics.json) and the subscription `peek` reads.
    "order-status": "topic",
    "order-status-local": "pull subscription",
}
EVENT = {
    "event_type": "OR_MGMT",
    "event_version": "v2",
    "event_direction": "IN",
    "entity_metadata": {
        "partnerId": "6231cfc8800d284c981b3146",
        "partnerName": "ExamplePartner",
        "entity_id": "order-12345",
        "entity_type": "Order",
    },
    "entity_data": {
        "orderId": 59735,
        "orderStatusLatest": "OR_PLC",
        "orderStatusLatestTimestamp": 1655292804,
        "orderLineItems": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 19.99}],
        "orderSummary": {"total": 39.98, "currency": "EUR"},
        "orderMetadata": {"channel": "web"},
    },
}
EVENT_ATTRIBUTES = {
    "event_type": "OR_MGMT",
    "event_version": "v2",
    "idempotency_key": "order-12345:OR_PLC:1655292804",
}


@dataclass
class Started:
    """The module's emulator and the output of its first ``start``."""

    script: EmulatorScript
    first: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    missing = emulator_prerequisites()
    if missing:
        unavailable(missing)
    script = EmulatorScript(f"127.0.0.1:{free_port()}", tmp_path_factory.mktemp("emulator-home"))
    first = script.run("start")
    if first.returncode != 0:
        script.run("stop")
        pytest.fail(f"pubsub-emulator.sh start failed:\n{first.stdout}{first.stderr}")
    yield Started(script, first)
    script.stop()


@pytest.fixture(scope="module")
def admin(started: Started) -> Iterator[Admin]:
    with Admin(started.script.host_port, started.script.project) as client:
        yield client


def table(output: str) -> dict[str, tuple[str, str]]:
    """Rows of the script's table: name -> (resource, state)."""
    rows = {}
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RESOURCE"))
    for line in lines[header + 1 :]:
        resource, name, state, *_ = re.split(r"\s{2,}", line)
        rows[name] = (resource, state)
    return rows


def states(output: str) -> dict[str, str]:
    """Rows of the script's table: name -> state."""
    return {name: state for name, (_, state) in table(output).items()}


def point_push_at(started: Started, endpoint: str, **env: str) -> dict[str, str]:
    """Re-run ``start`` with another endpoint (and settings); return the table's states."""
    result = started.script.run("start", {"PUSH_ENDPOINT": endpoint, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return states(result.stdout)


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys kept, leaves replaced by their type name."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


def test_start_creates_topic_push_subscription_and_dead_letter_queue(
    started: Started, admin: Admin
) -> None:
    rows = table(started.first.stdout)
    assert {name: resource for name, (resource, _) in rows.items()} == DEFAULT_NAMES
    assert {state for _, state in rows.values()} == {"created"}
    push = admin.subscriber.get_subscription(
        subscription=admin.subscription_path("partner-events-push")
    )
    assert push.topic == admin.topic_path("partner-events")
    assert push.push_config.push_endpoint == "http://127.0.0.1:8080/"
    assert push.ack_deadline_seconds == 60
    assert push.retry_policy.minimum_backoff.total_seconds() == 10
    assert push.retry_policy.maximum_backoff.total_seconds() == 600
    assert push.dead_letter_policy.dead_letter_topic == admin.topic_path("partner-events-dlq")
    assert push.dead_letter_policy.max_delivery_attempts == 100
    pull = admin.subscriber.get_subscription(
        subscription=admin.subscription_path("partner-events-dlq-pull")
    )
    assert pull.topic == admin.topic_path("partner-events-dlq")
    assert not pull.push_config.push_endpoint


def test_start_creates_the_workers_pull_subscription_with_the_push_policies(
    started: Started, admin: Admin
) -> None:
    worker = admin.subscriber.get_subscription(
        subscription=admin.subscription_path("partner-events-pull")
    )
    assert worker.topic == admin.topic_path("partner-events")
    assert not worker.push_config.push_endpoint
    assert worker.ack_deadline_seconds == 60
    assert worker.retry_policy.minimum_backoff.total_seconds() == 10
    assert worker.retry_policy.maximum_backoff.total_seconds() == 600
    assert worker.dead_letter_policy.dead_letter_topic == admin.topic_path("partner-events-dlq")
    assert worker.dead_letter_policy.max_delivery_attempts == 100
    (line,) = [row for row in started.first.stdout.splitlines() if "partner-events-pull " in row]
    assert "on partner-events; ack 60s; backoff 10s..600s" in line
    assert line.endswith("dead letter after 100 attempts to partner-events-dlq")


def test_a_published_event_reaches_both_the_push_and_the_pull_subscription(
    started: Started, admin: Admin
) -> None:
    with Receiver() as receiver:
        made = point_push_at(started, receiver.url, PUBSUB_TOPIC="fanout")
        try:
            message_id = admin.publish("fanout", b"both ways", EVENT_ATTRIBUTES)
            (push,) = receiver.wait_for(1)
            pulled = pull_until(admin, "fanout-pull", message_id)
        finally:
            for name in ("fanout-push", "fanout-pull", "fanout-dlq-pull"):
                admin.delete_subscription(name)
    assert made["fanout-pull"] == "created"
    assert push.json()["message"]["messageId"] == message_id
    assert pulled.message.data == b"both ways"
    assert dict(pulled.message.attributes) == EVENT_ATTRIBUTES


def pull_until(admin: Admin, subscription: str, message_id: str) -> Any:
    """Pull (and ack) ``subscription`` until ``message_id`` comes; fail after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for received in admin.pull(subscription):
            if received.message.message_id == message_id:
                return received
    pytest.fail(f"{message_id} never reached {subscription}")


def test_rerun_updates_the_pull_subscriptions_policy_and_drops_a_push_config(
    started: Started, admin: Admin
) -> None:
    # A push subscription left under the worker's name becomes a pull subscription.
    admin.ensure_topic("rerun")
    admin.ensure_push_subscription(
        "rerun-pull", "rerun", "http://127.0.0.1:9/", PushPolicy(max_delivery_attempts=0)
    )
    try:
        made = point_push_at(
            started, "http://127.0.0.1:9/", PUBSUB_TOPIC="rerun", PUSH_MIN_BACKOFF="2s",
            PUSH_MAX_DELIVERY_ATTEMPTS="5",
        )
        worker = admin.subscriber.get_subscription(
            subscription=admin.subscription_path("rerun-pull")
        )
    finally:
        for name in ("rerun-push", "rerun-pull", "rerun-dlq-pull"):
            admin.delete_subscription(name)
    assert made["rerun-pull"] == "updated"
    assert not worker.push_config.push_endpoint
    assert worker.retry_policy.minimum_backoff.total_seconds() == 2
    assert worker.dead_letter_policy.max_delivery_attempts == 5


def test_the_pull_subscription_takes_the_workers_variable(started: Started, admin: Admin) -> None:
    env = {"PUBSUB_TOPIC": "named", "EVENTBUS_PULL_SUBSCRIPTION": "named-worker"}
    try:
        rows = table(started.script.run("start", env).stdout)
    finally:
        for name in ("named-push", "named-worker", "named-dlq-pull"):
            admin.delete_subscription(name)
    assert rows["named-worker"] == ("pull subscription", "created")
    assert "named-pull" not in rows


def test_an_ordered_pull_subscription_is_made_on_request(started: Started, admin: Admin) -> None:
    env = {"PUBSUB_TOPIC": "ordered", "EVENTBUS_PULL_ORDERED": "1"}
    try:
        rows = table(started.script.run("start", env).stdout)
        (worker,) = [s for s in admin.subscriptions() if s.name.endswith("/ordered-pull")]
        refused = started.script.run("start", {"PUBSUB_TOPIC": "ordered"})
    finally:
        for name in ("ordered-push", "ordered-pull", "ordered-dlq-pull"):
            admin.delete_subscription(name)
    assert rows["ordered-pull"] == ("pull subscription", "created")
    assert worker.enable_message_ordering is True
    # Pub/Sub fixes ordering at creation: asked without it, the script says so, not ignores it.
    assert refused.returncode != 0 and "message ordering" in refused.stderr


def test_a_pull_subscription_named_like_another_is_refused(tmp_path: Path) -> None:
    script = EmulatorScript(f"127.0.0.1:{free_port()}", tmp_path)
    result = script.run("start", {"EVENTBUS_PULL_SUBSCRIPTION": "partner-events-push"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "pubsub-emulator: bad setting: each subscription needs a name of its own"
        " (PUBSUB_SUBSCRIPTION=partner-events-push,"
        " EVENTBUS_PULL_SUBSCRIPTION=partner-events-push,"
        " PUBSUB_DEAD_LETTER_SUBSCRIPTION=partner-events-dlq-pull)"
    )
    assert not (tmp_path / str(script.port) / "emulator.pid").exists()


def test_second_start_is_a_fast_no_op_that_reports_existed(started: Started) -> None:
    pid_file = started.script.home / str(started.script.port) / "emulator.pid"
    pid_before = pid_file.read_text()
    began = time.monotonic()
    again = started.script.run("start")
    elapsed = time.monotonic() - began
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    assert states(again.stdout) == dict.fromkeys(DEFAULT_NAMES, "existed")
    assert pid_file.read_text() == pid_before
    assert elapsed < 10, f"a second start took {elapsed:.1f}s"


def test_status_reports_up_address_log_and_resources(started: Started) -> None:
    result = started.script.run("status")
    assert result.returncode == 0, result.stderr
    assert "pubsub emulator: up" in result.stdout
    assert started.script.host_port in result.stdout
    assert str(started.script.log_path) in result.stdout
    # Its user: the checkout whose script started it (PUBSUB_EMULATOR_OWNER's default).
    assert f"used by: {PROJECT_ROOT}\n" in result.stdout
    for name in DEFAULT_NAMES:
        assert name in result.stdout


def test_push_delivers_the_wrapped_body(started: Started, admin: Admin) -> None:
    with Receiver() as receiver:
        assert point_push_at(started, receiver.url)["partner-events-push"] == "updated"
        data = json.dumps(EVENT, separators=(",", ":"), sort_keys=True).encode()
        message_id = admin.publish("partner-events", data, EVENT_ATTRIBUTES)
        (push,) = receiver.wait_for(1)
    body = push.json()
    message = body["message"]
    assert push.headers["Content-Type"] == "application/json"
    assert body["subscription"] == admin.subscription_path("partner-events-push")
    assert base64.b64decode(message["data"]) == data
    assert message["attributes"] == EVENT_ATTRIBUTES
    assert message["messageId"] == message["message_id"] == message_id
    assert message["publishTime"] == message["publish_time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", message["publishTime"])
    # The emulator (0.8.x) never sends deliveryAttempt, not even with the
    # dead-letter policy this subscription has; production does. If this
    # starts failing, the emulator changed: refresh the golden payload.
    assert "deliveryAttempt" not in body
    check_golden(push)


def check_golden(push: Push) -> None:
    """The real push keeps the golden payload's structure (rewritten with UPDATE_GOLDEN=1)."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        document = {
            "description": (
                "Real push from the Pub/Sub emulator (gcloud pubsub-emulator 0.8.x) for a"
                " subscription with a dead-letter policy: attributes set, snake_case"
                " duplicates, no deliveryAttempt, no orderingKey."
            ),
            "headers": {k: push.headers[k] for k in ("Content-Type", "User-Agent")},
            "body": push.json(),
        }
        GOLDEN.write_text(json.dumps(document, indent=2) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert shape(push.json()) == shape(golden["body"])


def test_message_without_attributes_has_an_empty_attributes_object(
    started: Started, admin: Admin
) -> None:
    with Receiver() as receiver:
        point_push_at(started, receiver.url)
        admin.publish("partner-events", b"no attributes", {})
        (push,) = receiver.wait_for(1)
    assert push.json()["message"]["attributes"] == {}


def test_nack_is_redelivered_after_the_minimum_backoff(started: Started, admin: Admin) -> None:
    settings = {"PUBSUB_TOPIC": "redelivery", "PUSH_MIN_BACKOFF": "1s", "PUSH_MAX_BACKOFF": "2s"}
    with Receiver(statuses=[503], then=204) as receiver:
        point_push_at(started, receiver.url, **settings)
        try:
            message_id = admin.publish("redelivery", b"retry me", {})
            first, second = receiver.wait_for(2)
            time.sleep(3)  # an acked message must not come back
            assert len(receiver.pushes) == 2
        finally:
            admin.delete_subscription("redelivery-push")
    assert [first.status, second.status] == [503, 204]
    assert first.json()["message"]["messageId"] == second.json()["message"]["messageId"]
    assert first.json()["message"]["messageId"] == message_id
    gap = second.at - first.at
    print(f"redelivery {gap:.2f}s after a 503 (minimum backoff 1s)")
    assert 0.5 <= gap <= 8, gap


def test_bad_setting_fails_before_starting_anything(tmp_path: Path) -> None:
    script = EmulatorScript(f"127.0.0.1:{free_port()}", tmp_path)
    result = script.run("start", {"PUSH_MAX_DELIVERY_ATTEMPTS": "4"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "pubsub-emulator: bad setting: max delivery attempts 4 is outside 5..100"
        " (0 turns dead-lettering off)"
    )
    assert not (tmp_path / str(script.port) / "emulator.pid").exists()
    assert emulator_processes(script.port) == []


def test_start_failure_is_one_line_naming_the_log(tmp_path: Path) -> None:
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\necho 'ERROR: no emulator here'\nexit 1\n")
    fake.chmod(0o755)
    script = EmulatorScript(f"127.0.0.1:{free_port()}", tmp_path / "home")
    result = script.run("start", {"GCLOUD": str(fake)})
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "exited before it was ready" in line
    assert "ERROR: no emulator here" in line
    assert line.endswith(f"log: {script.log_path}")
    assert not (script.log_path.parent / "emulator.pid").exists()


def test_start_refuses_a_port_that_something_else_serves(tmp_path: Path) -> None:
    with Receiver() as other:  # answers GET with 501: not an emulator
        script = EmulatorScript(other.url.removeprefix("http://").rstrip("/"), tmp_path)
        result = script.run("start")
    assert result.returncode == 1
    assert "is taken by something that is not a Pub/Sub emulator" in result.stderr


def test_stop_leaves_no_emulator_process_behind(tmp_path: Path) -> None:
    if missing := emulator_prerequisites():
        unavailable(missing)
    script = start_emulator(tmp_path)
    assert any("java" in command for command in emulator_processes(script.port))
    stopped = script.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    assert emulator_processes(script.port) == []
    status = script.run("status")
    assert status.returncode == 3
    assert "pubsub emulator: down" in status.stdout
    again = script.run("stop")
    assert again.returncode == 0
    assert "nothing to stop" in again.stdout


@pytest.mark.parametrize("ci", ["true", ""])
def test_missing_emulator_fails_under_ci_and_skips_elsewhere(ci: str) -> None:
    """Both emulator fixtures (this module's and tests/e2e's) with gcloud "missing"."""
    tests = [
        "tests/test_emulator_script.py::test_status_reports_up_address_log_and_resources",
        "tests/e2e/test_harness.py::test_push_route_delivers_to_the_service",
    ]
    env = {k: v for k, v in os.environ.items() if k != "E2E_REUSE_EMULATOR"}
    env.update(CI=ci, GCLOUD="/nonexistent/gcloud")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs", *tests],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1]
    if ci:
        # A fixture that calls pytest.fail reports an error: the run fails, nothing skips.
        assert result.returncode == 1, result.stdout
        assert "2 errors" in summary and "skipped" not in summary, summary
        assert "failing instead of skipping" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "2 skipped" in summary, summary
