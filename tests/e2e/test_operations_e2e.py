"""The operator commands through the real emulator and gunicorn service.

- Replay: an event FAILED for good (its handler is broken), the handler is
  repaired, ``eventbus replay KEY`` (the installed console script, in a shell
  with only the settings) republishes it, the push path processes it: SUCCESS,
  the effect ran exactly once, and the record keeps the audit entry.
- ``dlq drain``: messages published straight to the dead-letter topic (as the
  broker would dead-letter them; the emulator's own dead-lettering is not
  reliable) are stored or marked, then acked: the subscription is empty after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.e2e import ops_handlers, support
from tests.e2e.harness import PushRoute, ServiceProcess, wait_until


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_ops")


def eventbus(route: PushRoute, mongo_uri: str, db: Database, cwd: Path,
             *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m eventbus ARGV`` with nothing but the settings of this route."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PUBSUB_", "EVENTBUS_", "MONGODB_", "GOOGLE_CLOUD_"))}
    env.update(route.service_env(), MONGODB_URI=mongo_uri, MONGODB_DB=db.name,
               EVENTBUS_OPERATOR="e2e@example.com")
    return subprocess.run([sys.executable, "-m", "eventbus", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_replay_of_an_event_failed_for_good_succeeds_once_after_the_fix(
    service: Callable[..., ServiceProcess], push_route: Callable[..., PushRoute],
    emulator: str, mongo_uri: str, db: Database, tmp_path: Path,
) -> None:
    broken = tmp_path / "broken"
    broken.write_text("yes")
    svc = service(env=support.service_env(
        mongo_uri, db.name, emulator, EVENTBUS_HANDLER_MODULES="tests.e2e.ops_handlers",
        E2E_BROKEN_FILE=str(broken)))
    route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)
    tag = f"r-{uuid.uuid4().hex[:10]}"
    payload = support.event("TEST_REPAIRABLE", tag=tag)
    route.publish(support.encode(payload), idempotency_key=tag)
    key = support.stored_key(payload, {"idempotency_key": tag})
    failed = support.wait_for_status(db, key, "FAILED")
    assert failed["retryable"] is False and failed["error"]["classification"] == "permanent"
    assert support.effect_runs(db, tag) == 0

    dry = eventbus(route, mongo_uri, db, tmp_path, "replay", key, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["keys"] == [key]
    broken.unlink()  # the handler is repaired (a deploy, in real life)
    done = eventbus(route, mongo_uri, db, tmp_path, "replay", key, "--why", "handler fixed")
    assert done.returncode == 0, done.stderr
    assert "1 of 1 replayed" in done.stdout

    record = support.wait_for_status(db, key, "SUCCESS")
    wait_until(lambda: support.effect_runs(db, tag) == 1, message="one effect")
    (entry,) = record["replays"]
    assert (entry["by"], entry["why"], entry["attempt"]) == ("e2e@example.com",
                                                             "handler fixed", 1)
    assert record["replayed_at_attempt"] == 1 and record["attempts"] == 2
    shown = eventbus(route, mongo_uri, db, tmp_path, "show", key, "--json")
    assert [a["after_replay"] for a in json.loads(shown.stdout)["attempts"]] == [False, True]
    again = eventbus(route, mongo_uri, db, tmp_path, "replay", key)
    assert again.returncode == 1 and "is SUCCESS, not FAILED" in again.stderr
    assert support.effect_runs(db, tag) == 1


def test_dlq_drain_stores_or_marks_each_dead_letter_then_acks(
    service: Callable[..., ServiceProcess], push_route: Callable[..., PushRoute],
    emulator: str, mongo_uri: str, db: Database, tmp_path: Path,
) -> None:
    svc = service(env=support.service_env(
        mongo_uri, db.name, emulator, EVENTBUS_HANDLER_MODULES="tests.e2e.ops_handlers"))
    route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5,
                       max_delivery_attempts=5)
    assert route.dead_letter_topic and route.dead_letter_subscription
    seen_tag, new_tag = (f"d-{uuid.uuid4().hex[:10]}" for _ in range(2))
    seen = support.event("TEST_REPAIRABLE", tag=seen_tag)
    route.publish(support.encode(seen), idempotency_key=seen_tag)
    seen_key = support.stored_key(seen, {"idempotency_key": seen_tag})
    support.wait_for_status(db, seen_key, "SUCCESS")
    new = support.event("TEST_REPAIRABLE", tag=new_tag)
    new_key = support.stored_key(new, {"idempotency_key": new_tag})
    admin = route.admin
    admin.publish(route.dead_letter_topic, support.encode(seen), {"idempotency_key": seen_tag})
    admin.publish(route.dead_letter_topic, support.encode(new), {"idempotency_key": new_tag})
    admin.publish(route.dead_letter_topic, b"{not json", {})

    drained = eventbus(route, mongo_uri, db, tmp_path, "dlq", "drain", "--subscription",
                       route.dead_letter_subscription, "--json", "--wait", "2")
    assert drained.returncode == 0, drained.stderr
    report = json.loads(drained.stdout)
    assert (report["pulled"], report["stored"], report["marked"], report["acked"]) == (
        3, 2, 1, 3)
    marked = support.record_of(db, seen_key)
    assert marked is not None and marked["event_status"] == "SUCCESS"
    assert marked["dead_lettered"]["subscription"].endswith(route.dead_letter_subscription)
    stored = support.record_of(db, new_key)
    assert stored is not None and stored["event_status"] == "FAILED"
    assert stored["retryable"] is False and stored["dead_lettered"]["messageId"]
    assert stored["error"]["type"] == "DeadLettered"
    (invalid,) = [k for k in report["keys"] if k.startswith("invalid:")]
    bad = support.record_of(db, invalid)
    assert bad is not None and bad["raw_payload"] == "{not json"
    assert bad["error"]["classification"] == "invalid"
    assert route.dead_letters() == []  # every message was acked
    assert support.effect_runs(db, new_tag) == 0 and ops_handlers.EFFECTS == "e2e_effects"
