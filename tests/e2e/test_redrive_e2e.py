"""Store-driven redrive through the emulator: a stranded retryable event is finished.

The broker is taken out of the picture on purpose: the first delivery is
POSTed straight to the service (as a push whose message no subscription
holds), the handler fails transiently, and nothing will ever deliver it
again, like a message whose retention ran out or that the emulator stranded.
Then ``eventbus redrive --once`` publishes it again through the emulator, the
push subscription delivers it, and it succeeds, with one effect.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.e2e import support
from tests.e2e.harness import PROJECT_ROOT, PushRoute, ServiceProcess

REDRIVE_AFTER = 1.0


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_redrive")


def redrive(mongo_uri: str, db: Database, route: PushRoute) -> subprocess.CompletedProcess[str]:
    # The sweeper places messages with the service's own router (EVENTBUS_APP),
    # the fault handlers included, as the deployed job does.
    env = {**os.environ, "MONGODB_URI": mongo_uri, "MONGODB_DB": db.name,
           "EVENTBUS_REDRIVE_AFTER_SECONDS": str(REDRIVE_AFTER), "EVENTBUS_APP": "main:app",
           "EVENTBUS_HANDLER_MODULES": support.HANDLER_MODULES, **route.service_env()}
    return subprocess.run([sys.executable, "-m", "eventbus", "redrive", "--once"], env=env,
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_stranded_retryable_event_is_finished_by_the_redrive_sweeper(
        service: Callable[..., ServiceProcess], push_route: Callable[..., PushRoute],
        emulator: str, mongo_uri: str, db: Database) -> None:
    env = support.service_env(mongo_uri, db.name, emulator,
                              EVENTBUS_REDRIVE_AFTER_SECONDS=str(REDRIVE_AFTER))
    svc = service(env=env)
    route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)
    tag = f"t-{uuid.uuid4().hex[:10]}"
    payload = support.event("TEST_FLAKY", tag=tag, fail_times=1)
    attributes = {"idempotency_key": f"stranded-{tag}"}
    key = support.stored_key(payload, attributes)

    status, body = support.post(svc.url, support.wrapped_body(payload, "m-1", **attributes))
    assert (status, body["outcome"]) == (503, "retry")
    record = support.record_of(db, key)
    assert record is not None and record["event_status"] == "FAILED" and record["retryable"]
    time.sleep(REDRIVE_AFTER + 0.5)  # nothing will deliver it again: it is stranded
    assert support.record_of(db, key)["event_status"] == "FAILED"  # type: ignore[index]

    done = redrive(mongo_uri, db, route)
    assert done.returncode == 0, done.stderr
    assert "republished 1" in done.stdout

    finished = support.wait_for_status(db, key, "SUCCESS", timeout=30)
    assert finished["attempts"] == 2 and finished["redrives"] == 1
    assert support.effect_runs(db, tag) == 1
    # A second sweep finds nothing left to do.
    again = redrive(mongo_uri, db, route)
    assert again.returncode == 0 and "republished 0," in again.stdout
    assert support.effect_runs(db, tag) == 1
