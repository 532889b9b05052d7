"""Many identical deliveries at once, straight at a 4-worker gunicorn service.

Each delivery is the same wrapped push body, POSTed by its own thread, all
released together by a barrier. The handler (``TEST_EFFECT``) sleeps 0.2 s
before its non-idempotent ``$inc``, so the other deliveries meet a live
lease. The lease (30 s) is far longer than the handler, so only the
claim's atomicity can keep the effect to one run.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.e2e import support
from tests.e2e.harness import ServiceProcess

WORKERS = 4
HANDLER_SECONDS = 0.2


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_concurrency")


@pytest.fixture
def svc(
    service: Callable[..., ServiceProcess], emulator: str, mongo_uri: str, db: Database
) -> ServiceProcess:
    env = support.service_env(mongo_uri, db.name, emulator, EVENTBUS_LEASE_SECONDS="30")
    return service(env=env, workers=WORKERS)


def fire_at_once(url: str, bodies: list[bytes]) -> list[tuple[int, dict[str, Any]]]:
    """POST every body from its own thread, all released at the same moment."""
    barrier = threading.Barrier(len(bodies))

    def send(body: bytes) -> tuple[int, dict[str, Any]]:
        barrier.wait(timeout=30)
        return support.post(url, body, timeout=60)

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(send, bodies))


def payload(name: str) -> dict[str, Any]:
    return support.event("TEST_EFFECT", tag=name, sleep=HANDLER_SECONDS)


def delivery(name: str, message_id: str) -> bytes:
    return support.wrapped_body(payload(name), message_id, idempotency_key=name)


def assert_processed_once(
    db: Database, name: str, answers: list[tuple[int, dict[str, Any]]]
) -> None:
    statuses = Counter(status for status, _ in answers)
    assert set(statuses) <= {200, 503}, statuses
    outcomes = Counter(body.get("outcome") for _, body in answers)
    assert outcomes["processed"] == 1, outcomes
    assert set(outcomes) <= {"processed", "duplicate", "in_progress"}, outcomes
    assert support.effect_runs(db, name) == 1
    record = support.record_of(db, support.stored_key(payload(name), {"idempotency_key": name}))
    assert record is not None
    assert (record["event_status"], record["attempts"]) == ("SUCCESS", 1)
    assert list(record["entity_metadata"]["resilienceAttemptCount"]) == ["1"]


def test_fifty_identical_deliveries_run_the_handler_once(svc: ServiceProcess, db: Database) -> None:
    name = f"c-{uuid.uuid4().hex[:10]}"
    answers = fire_at_once(svc.url, [delivery(name, "m-1")] * 50)

    assert_processed_once(db, name, answers)


def test_several_keys_at_once_each_run_once(svc: ServiceProcess, db: Database) -> None:
    names = [f"c-{uuid.uuid4().hex[:10]}" for _ in range(4)]
    # Different message ids, as Pub/Sub redeliveries of a re-published event would have.
    bodies = [(name, delivery(name, f"m-{i}")) for name in names for i in range(15)]
    random.Random(7).shuffle(bodies)

    answers = fire_at_once(svc.url, [body for _, body in bodies])

    for name in names:
        mine = [answer for (owner, _), answer in zip(bodies, answers, strict=True) if owner == name]
        assert len(mine) == 15
        assert_processed_once(db, name, mine)
