"""Faults under the real emulator and gunicorn: MongoDB going away, a worker dying.

- The service reaches MongoDB through a ``TcpProxy`` the test cuts mid-run:
  every push meanwhile answers 503 (``unavailable``) and Pub/Sub keeps the
  messages; after the proxy is restored every event finishes, each effect once.
- A handler SIGKILLs its own worker on the first attempt: the record stays
  PROCESSING until its 3 s lease expires, then a redelivery finishes it.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.e2e import fault_handlers, support
from tests.e2e.harness import PushRoute, ServiceProcess, wait_until

FIRST_BATCH = 5
SECOND_BATCH = 15


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_faults")


def publish_tagged(route: PushRoute, event_type: str, count: int) -> dict[str, str]:
    """Publish ``count`` events of ``event_type``, each with its own tag as its key.

    Returns each tag's stored key (the publisher's key, scoped by partner).
    """
    keys = {}
    for name in [f"f-{uuid.uuid4().hex[:10]}" for _ in range(count)]:
        payload = support.event(event_type, tag=name)
        route.publish(support.encode(payload), idempotency_key=name)
        keys[name] = support.stored_key(payload, {"idempotency_key": name})
    return keys


def statuses(db: Database, keys: list[str]) -> dict[str, str]:
    """The ``event_status`` of each stored key among ``keys``."""
    found = db.partner_events.find({"idempotency_key": {"$in": keys}})
    return {doc["idempotency_key"]: doc["event_status"] for doc in found}


def all_success(db: Database, keys: list[str]) -> bool:
    seen = statuses(db, keys)
    return len(seen) == len(keys) and set(seen.values()) == {"SUCCESS"}


def every_claim_waits_at_the_gate(db: Database, keys: list[str]) -> bool:
    """True when some of ``keys`` is PROCESSING and each one's handler is blocked at the gate.

    Then no handler is between its effect and its finishing update, so
    cutting MongoDB now cannot leave an effect done but unrecorded.
    """
    processing = list(db.partner_events.find({"idempotency_key": {"$in": keys},
                                              "event_status": "PROCESSING"}))  # fmt: skip
    waiting = {(w["key"], w["attempt"]) for w in db[fault_handlers.GATE_WAITS].find()}
    return bool(processing) and all(
        (doc["idempotency_key"], doc["attempts"]) in waiting for doc in processing
    )


def unavailable_lines(svc: ServiceProcess) -> list[dict[str, object]]:
    return [line for line in support.request_lines(svc) if line.get("outcome") == "unavailable"]


def test_mongodb_outage_answers_503_and_every_event_finishes_once(
    service: Callable[..., ServiceProcess],
    push_route: Callable[..., PushRoute],
    emulator: str,
    mongo_uri: str,
    db: Database,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    with support.TcpProxy(support.mongo_address(mongo_uri)) as proxy:
        env = support.service_env(
            support.proxied_uri(mongo_uri, proxy.port), db.name, emulator,
            EVENTBUS_LEASE_SECONDS="3", EVENTBUS_STORE_TIMEOUT_MS="1000",
            E2E_GATE_FILE=str(gate),
        )  # fmt: skip
        svc = service(env=env)
        route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)
        before = publish_tagged(route, "TEST_GATED", FIRST_BATCH)
        wait_until(lambda: all_success(db, list(before.values())), timeout=30,
                   message="the first batch")  # fmt: skip

        gate.touch()  # handlers of the second batch now block before their effect
        after = publish_tagged(route, "TEST_GATED", SECOND_BATCH)
        wait_until(lambda: every_claim_waits_at_the_gate(db, list(after.values())), timeout=30,
                   message="claims blocked at the gate")  # fmt: skip
        proxy.cut()
        gate.unlink()
        wait_until(lambda: len(unavailable_lines(svc)) >= 3, timeout=30,
                   message="three 503 'unavailable' answers while MongoDB is cut")  # fmt: skip
        proxy.restore()
        wait_until(lambda: all_success(db, list(after.values())), timeout=90,
                   message="the second batch")  # fmt: skip

    assert all(line["status"] == 503 for line in unavailable_lines(svc))
    assert {line["status"] for line in support.request_lines(svc)} <= {200, 503}
    names = [*before, *after]
    assert [support.effect_runs(db, name) for name in names] == [1] * len(names)
    interrupted = {w["key"] for w in db[fault_handlers.GATE_WAITS].find()}
    assert interrupted and interrupted <= set(after.values())
    for key in interrupted:
        record = support.record_of(db, key)
        assert record is not None and record["attempts"] >= 2


def test_worker_killed_mid_handler_is_finished_after_the_lease_expires(
    service: Callable[..., ServiceProcess],
    push_route: Callable[..., PushRoute],
    emulator: str,
    mongo_uri: str,
    db: Database,
) -> None:
    env = support.service_env(mongo_uri, db.name, emulator, EVENTBUS_LEASE_SECONDS="3")
    svc = service(env=env)
    route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)
    ((name, key),) = publish_tagged(route, "TEST_CRASH", 1).items()

    record = support.wait_for_status(db, key, "SUCCESS", timeout=45)

    assert record["attempts"] >= 2
    assert len(record["entity_metadata"]["resilienceAttemptCount"]) == record["attempts"]
    assert support.effect_runs(db, name) == 1
    lines = support.wait_for_outcome(svc, key, "processed")
    # Attempt 1 died with its worker before logging; redeliveries under its lease waited.
    assert {line["outcome"] for line in lines} <= {"in_progress", "processed"}
    processed = [line for line in lines if line["outcome"] == "processed"]
    assert len(processed) == 1 and processed[0]["attempt"] >= 2
    assert "SIGKILL" in svc.log_path.read_text()
    with urllib.request.urlopen(f"{svc.url}/health", timeout=5) as response:
        assert response.status == 200  # the master replaced the worker
