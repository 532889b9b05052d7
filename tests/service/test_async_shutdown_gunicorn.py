"""SIGTERM while ``async def`` handlers await, under real gunicorn services (issue 39).

The guide's promise (GUIDE.md "Async handlers", shutdown; README; REFERENCE.md's
guarantees): at shutdown, async handlers still awaiting after
``EVENTBUS_ASYNC_STOP_GRACE_SECONDS`` are cancelled and their events given back:
PENDING, the attempt not spent, answered 503, so Pub/Sub redelivers them.

Two services share one fresh MongoDB database. The first (``hang``) serves an
``async def`` handler that awaits an event it never gets; pushes are sent to it
side by side, and once every record is PROCESSING and every handler awaits, the
gunicorn master gets SIGTERM. Each push must then end without a 2xx (a 503, or the
connection closed), every record must be PENDING with its attempt returned and no
lease owner, and gunicorn must exit before its graceful timeout. The second service
(``done``) gets the same pushes again, as Pub/Sub's redelivery, and runs each handler
to SUCCESS exactly once.

Both push entries are tried: ``wsgi`` (``create_app`` under gunicorn's threaded
worker, as ``main:app`` is deployed) and ``asgi`` (``asgi_app`` under gunicorn with
uvicorn's worker, as the README gives it). gunicorn imports ``served_app()`` or
``served_asgi()`` from this module; ``ASYNC_SHUTDOWN_PHASE`` says which handler runs.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flask
import pytest
from pymongo import MongoClient
from pymongo.database import Database

from eventbus import Context, Router, asgi_app, create_app
from eventbus.settings import Settings
from tests.e2e import support

pytestmark = [pytest.mark.slow]

PHASE = "ASYNC_SHUTDOWN_PHASE"
"""``hang``: the handler records its start and awaits forever; ``done``: it records its run."""
RUNS = "async_shutdown_runs"
EVENT_TYPE = "TEST_AWAITS"
PUSHES = 4
GRACEFUL_TIMEOUT = 10.0
"""gunicorn's ``--graceful-timeout``: after it the master SIGKILLs a worker still running."""
ASYNC_GRACE = 1.0
"""``EVENTBUS_ASYNC_STOP_GRACE_SECONDS``: well inside the graceful timeout."""
ENTRIES = {
    "wsgi": ("tests.service.test_async_shutdown_gunicorn:served_app()", ()),
    "asgi": ("tests.service.test_async_shutdown_gunicorn:served_asgi()",
             ("-k", "uvicorn_worker.UvicornWorker")),
}

_runs_lock = threading.Lock()
_runs_db: Database | None = None


def _runs() -> Any:
    """The collection the served handler records its starts and runs in (the store's db)."""
    global _runs_db
    with _runs_lock:
        if _runs_db is None:
            client: MongoClient = MongoClient(os.environ["MONGODB_URI"])
            _runs_db = client[os.environ["MONGODB_DB"]]
    return _runs_db[RUNS]


def router() -> Router:
    """One ``async def`` handler: it awaits forever (``hang``) or runs at once (``done``)."""
    routes = Router()

    @routes.handler(EVENT_TYPE)
    async def awaits(context: Context) -> None:
        phase = os.environ.get(PHASE, "done")
        await asyncio.to_thread(_runs().insert_one, {
            "tag": context.event.entity_data["tag"], "phase": phase,
            "attempt": context.attempt, "pid": os.getpid()})
        if phase == "hang":
            await asyncio.Event().wait()  # never set: only shutdown's cancellation ends it

    return routes


def served_app() -> flask.Flask:
    """gunicorn's WSGI app: ``create_app`` on the environment's store."""
    return create_app(router(), Settings.from_env())


def served_asgi() -> Any:
    """gunicorn's ASGI app (uvicorn's worker): ``asgi_app`` over ``create_app``."""
    return asgi_app(served_app())


@dataclass
class Push:
    """One push sent on its own connection, and how it ended."""

    tag: str
    payload: dict[str, Any]
    attributes: dict[str, str]
    status: int | None = None
    body: bytes = b""
    error: str = ""

    @property
    def body_bytes(self) -> bytes:
        return support.wrapped_body(self.payload, f"m-{self.tag}", **self.attributes)

    @property
    def key(self) -> str:
        return support.stored_key(self.payload, self.attributes)

    def send(self, port: int, timeout: float = 60.0) -> None:
        """POST the push; keep the answer, or the error that ended the connection."""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("POST", "/", body=self.body_bytes,
                         headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            self.status, self.body = answer.status, answer.read()
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()


def make_pushes(run: str) -> list[Push]:
    pushes = []
    for index in range(PUSHES):
        tag = f"{run}-{index}"
        payload = support.event(EVENT_TYPE, tag=tag)
        payload["entity_metadata"]["entity_id"] = f"e-{tag}"
        pushes.append(Push(tag, payload, {"idempotency_key": f"as-{tag}"}))
    return pushes


@pytest.fixture()
def database(mongo_client: MongoClient) -> Iterator[Database]:
    """A fresh database both services share (``mongo_client``: fails under CI=true if absent)."""
    name = f"test_async_shutdown_{uuid.uuid4().hex[:10]}"
    yield mongo_client[name]
    mongo_client.drop_database(name)


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_sigterm_while_async_handlers_await_gives_every_push_back(
        entry: str, mongo_uri: str, database: Database, tmp_path: Path) -> None:
    from tests.e2e.harness import ServiceError, ServiceProcess, gunicorn_command, wait_until

    if gunicorn_command() is None:
        pytest.skip("gunicorn is not installed")
    db, name = database, database.name
    app, worker = ENTRIES[entry]
    env = {"MONGODB_URI": mongo_uri, "MONGODB_DB": name, "EVENTBUS_AUTH": "false",
           "EVENTBUS_COLLECTION": "partner_events", "EVENTBUS_RELAY_INLINE": "false",
           "EVENTBUS_ASYNC_STOP_GRACE_SECONDS": str(ASYNC_GRACE),
           "GUNICORN_THREADS": str(PUSHES * 2)}
    args = (*worker, "--graceful-timeout", str(int(GRACEFUL_TIMEOUT)))

    def service(phase: str) -> ServiceProcess:
        return ServiceProcess(log_path=tmp_path / f"{phase}.log", app=app, workers=1,
                              env={**env, PHASE: phase}, extra_args=args)

    def records() -> dict[str, dict[str, Any]]:
        keys = [push.key for push in pushes]
        return {str(doc["idempotency_key"]): doc
                for doc in db["partner_events"].find({"idempotency_key": {"$in": keys}})}

    pushes = make_pushes(uuid.uuid4().hex[:8])
    hang, done = service("hang"), service("done")
    try:
        try:
            hang.start()
        except ServiceError as exc:
            pytest.fail(str(exc), pytrace=False)
        senders = [threading.Thread(target=push.send, args=(hang.port,)) for push in pushes]
        for sender in senders:
            sender.start()
        wait_until(lambda: len(records()) == PUSHES and all(
            r.get("event_status") == "PROCESSING" for r in records().values()),
            timeout=30, message="every push's record to be PROCESSING")
        wait_until(lambda: db[RUNS].count_documents({"phase": "hang"}) == PUSHES,
                   timeout=30, message="every async handler to be awaiting")

        assert hang.process is not None
        signalled = time.monotonic()
        hang.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = hang.process.wait(timeout=GRACEFUL_TIMEOUT + 10)
        except subprocess.TimeoutExpired:  # stop() in the clean-up kills the group
            code = None
        took = time.monotonic() - signalled
        for sender in senders:
            sender.join(timeout=30)
        log = hang.log_path.read_text(errors="replace")
        seen = {push.tag: (push.status, push.body[:200], push.error) for push in pushes}
        stored = {push.tag: {field: records().get(push.key, {}).get(field) for field in
                             ("event_status", "attempts", "lease_owner")} for push in pushes}
        observed = (f"gunicorn exit {code} after {took:.1f}s; answers {seen}; "
                    f"records {stored}; log tail:\n{hang.tail(30)}")

        # No push was acked, and none got a 500: each is a 503 or a connection closed unanswered.
        assert all(not sender.is_alive() for sender in senders), observed
        assert all(push.status is None or push.status == 503 for push in pushes), observed
        for push in pushes:
            if push.status == 503:  # given back: IN_PROGRESS, never a failure stored
                assert json.loads(push.body).get("outcome") == "in_progress", observed
        # Every record given back: PENDING, the attempt returned, no lease owner left.
        assert all(s["event_status"] == "PENDING" for s in stored.values()), observed
        assert all(not s["attempts"] for s in stored.values()), observed
        assert all(s["lease_owner"] is None for s in stored.values()), observed
        # gunicorn ended on its own, before its graceful timeout (no SIGKILL of the worker).
        assert code == 0 and took < GRACEFUL_TIMEOUT, observed
        assert "Traceback" not in log, observed

        # Pub/Sub redelivers: a second service on the same store runs each once, to SUCCESS.
        try:
            done.start()
        except ServiceError as exc:
            pytest.fail(str(exc), pytrace=False)
        again = make_redeliveries(pushes)
        redeliver = [threading.Thread(target=push.send, args=(done.port,)) for push in again]
        for sender in redeliver:
            sender.start()
        for sender in redeliver:
            sender.join(timeout=60)
        answers = {push.tag: (push.status, push.body[:200], push.error) for push in again}
        assert all(push.status == 200 and json.loads(push.body)["outcome"] == "processed"
                   for push in again), answers
        final = records()
        assert all(final[push.key]["event_status"] == "SUCCESS"
                   and final[push.key]["attempts"] == 1
                   and final[push.key].get("lease_owner") is None for push in pushes), final
        for push in again:  # a later redelivery is a duplicate: no second run
            push.send(done.port)
            assert (push.status, json.loads(push.body)["outcome"]) == (200, "duplicate")
        for push in pushes:
            runs = list(db[RUNS].find({"tag": push.tag, "phase": "done"}))
            assert [run["attempt"] for run in runs] == [1], (push.tag, runs)
    finally:
        for process in (hang, done):
            process.terminate(quick=True)
        for process in (hang, done):
            process.stop()


def make_redeliveries(pushes: list[Push]) -> list[Push]:
    """The same messages again (Pub/Sub redelivers a push that got no 2xx)."""
    return [Push(push.tag, push.payload, push.attributes) for push in pushes]
