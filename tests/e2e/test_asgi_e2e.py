"""The ASGI push entry under a real server: the emulator pushes to ``main:asgi_app``.

The service runs as the README gives it for an ASGI stack (gunicorn with uvicorn's
worker, ``gunicorn -k uvicorn_worker.UvicornWorker main:asgi_app``), so uvicorn serves
the app with its lifespan. An ``async def`` handler (``TEST_ASYNC``) awaits on the
processor's loop; a duplicate is acked without a second run; a body that is not a push
is a 400; and on SIGTERM the lifespan's end closes the processor (the worker exits
cleanly, its log says so).
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable, Iterator

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.e2e import support
from tests.e2e.harness import PushRoute, ServiceProcess, wait_until

ASGI = ["-k", "uvicorn_worker.UvicornWorker"]


@pytest.fixture(scope="module")
def db(mongo_client: MongoClient) -> Iterator[Database]:
    yield from support.module_database(mongo_client, "e2e_asgi")


@pytest.fixture
def svc(service: Callable[..., ServiceProcess], emulator: str, mongo_uri: str,
        db: Database) -> ServiceProcess:
    process = service(env=support.service_env(mongo_uri, db.name, emulator),
                      app="main:asgi_app", workers=1, extra_args=ASGI)
    return process


def test_an_async_handler_runs_once_behind_the_asgi_entry(
        svc: ServiceProcess, push_route: Callable[..., PushRoute], emulator: str,
        db: Database) -> None:
    route = push_route(emulator, f"{svc.url}/", min_backoff=1, max_backoff=5)
    tag = f"t-{uuid.uuid4().hex[:10]}"
    payload = support.event("TEST_ASYNC", tag=tag, sleep=0.2)
    key = support.stored_key(payload, {"idempotency_key": f"asgi-{tag}"})
    data = support.encode(payload)
    route.publish(data, idempotency_key=f"asgi-{tag}")
    record = support.wait_for_status(db, key, "SUCCESS", timeout=30)
    assert record["attempts"] == 1 and support.effect_runs(db, tag) == 1

    status, body = support.post(svc.url, support.wrapped_body(payload, "m-dup",
                                                              idempotency_key=f"asgi-{tag}"))
    assert (status, body["outcome"]) == (200, "duplicate")
    assert support.effect_runs(db, tag) == 1

    status, body = support.post(svc.url, b"\xff not a push")
    assert status == 400 and support.effect_runs(db, tag) == 1


def test_sigterm_ends_the_lifespan_and_closes_the_processor(svc: ServiceProcess) -> None:
    status, _ = support.post(svc.url, json.dumps({"message": {}}).encode())
    assert status == 400  # it serves
    assert svc.process is not None
    svc.process.send_signal(signal.SIGTERM)
    wait_until(lambda: svc.process is not None and svc.process.poll() is not None,
               timeout=30, message="the ASGI service to stop on SIGTERM")
    log = svc.log_path.read_text(errors="replace")
    assert "Application shutdown complete" in log  # uvicorn ran the lifespan's end
    assert "Traceback" not in log
