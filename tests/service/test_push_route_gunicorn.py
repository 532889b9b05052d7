"""``PushRoute`` under real gunicorn services on one MongoDB store (issue 39 fault 6, issue 40).

Three services share one database: ``push`` (``create_app`` as deployed, pushes answered
by ``PushRoute``), ``flask`` (the same app with a request hook that changes nothing, so
every push goes through Flask's dispatch) and ``sessions`` (``create_app`` with an app's
own ``session_interface``, which stamps each answer it saves). Requests are written raw
on a socket, so a test sends what no HTTP library would: a hostile ``Host``, or a CR or
LF inside a header value (werkzeug's test client refuses those before any request).

gunicorn imports ``served_app()`` from this module; ``PUSH_ROUTE_VARIANT`` says which.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flask
import pytest
from pymongo import MongoClient

from eventbus import create_app
from eventbus.settings import Settings
from tests.service.test_push_route import (
    REFUSED_HOSTS,
    RecordingSessions,
    delivery,
    event,
    noop_router,
)

pytestmark = [pytest.mark.slow, pytest.mark.same_worker(
    reason="the module's three gunicorn services start once, for all its tests")]

VARIANT = "PUSH_ROUTE_VARIANT"
APP = "tests.service.test_push_route_gunicorn:served_app()"


def served_app() -> flask.Flask:
    """The app gunicorn serves: ``create_app`` on the environment's store, as ``VARIANT`` says."""
    app = create_app(noop_router(), Settings.from_env())
    variant = os.environ.get(VARIANT, "push")
    if variant == "flask":
        app.before_request(lambda: None)  # changes nothing but the route a push takes
    elif variant == "sessions":
        app.session_interface = RecordingSessions()
    return app


@dataclass(frozen=True)
class Answer:
    """One raw HTTP answer: status code, headers (names lowercased) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self, route: str = "") -> Any:
        """The body as JSON, without what differs per request (the request id, the route's
        own idempotency key suffix ``route``)."""
        parsed = json.loads(self.body)
        parsed.pop("requestId", None)
        if route and "idempotency_key" in parsed:
            parsed["idempotency_key"] = parsed["idempotency_key"].removesuffix(route)
        return parsed


def raw_post(port: int, body: bytes, *header_lines: bytes,
             host: bytes = b"127.0.0.1") -> Answer:
    """POST ``body`` on ``/`` with ``header_lines`` written exactly as given."""
    head = [b"POST / HTTP/1.1", b"Host: " + host, *header_lines,
            b"Content-Type: application/json", b"Content-Length: %d" % len(body),
            b"Connection: close"]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    status_head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = status_head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    return Answer(int(status_line.split(" ")[1]), headers, rest)


@dataclass(frozen=True)
class Services:
    """The three services' ports and the store they share."""

    ports: Mapping[str, int]
    client: MongoClient
    database: str

    def stored(self, key: str) -> list[dict[str, Any]]:
        """The store's records whose idempotency key ends in ``key``."""
        collection = self.client[self.database]["partner_events"]
        return [doc for doc in collection.find({}) if str(doc.get("_id", "")).endswith(key)
                or str(doc.get("idempotency_key", "")).endswith(key)]


@pytest.fixture(scope="module")
def services(mongo_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Start the three gunicorn services on one fresh database; stop them afterwards."""
    from tests.e2e.harness import ServiceError, ServiceProcess, gunicorn_command

    if gunicorn_command() is None:
        pytest.skip("gunicorn is not installed")
    database = f"test_push_route_{uuid.uuid4().hex[:10]}"
    logs: Path = tmp_path_factory.mktemp("push-route-gunicorn")
    processes = {variant: ServiceProcess(
        log_path=logs / f"{variant}.log", app=APP, workers=1,
        env={VARIANT: variant, "MONGODB_URI": mongo_uri, "MONGODB_DB": database,
             "EVENTBUS_AUTH": "false", "EVENTBUS_COLLECTION": "partner_events",
             "EVENTBUS_RELAY_INLINE": "false", "GUNICORN_THREADS": "2"})
        for variant in ("push", "flask", "sessions")}
    client: MongoClient = MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    try:
        for process in processes.values():
            process.start()
        yield Services({variant: p.port for variant, p in processes.items()}, client, database)
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)
    finally:
        for process in processes.values():
            process.terminate(quick=True)
        for process in processes.values():
            process.stop()
        client.drop_database(database)
        client.close()


@pytest.mark.parametrize("host", sorted(REFUSED_HOSTS.values()), ids=sorted(REFUSED_HOSTS))
def test_a_host_flask_refuses_is_a_400_on_both_services(services: Services,
                                                        host: str) -> None:
    key = f"gh-{uuid.uuid4().hex[:8]}"
    body = delivery(event(), idempotency_key=key)
    answers = [raw_post(services.ports[route], body, host=host.encode())
               for route in ("push", "flask")]
    assert answers[0].status == answers[1].status == 400
    assert answers[0].body == answers[1].body
    assert answers[0].json()["error"] == "bad_request"
    assert services.stored(key) == []  # neither service processed it


def test_both_services_share_the_store(services: Services) -> None:
    key = f"gs-{uuid.uuid4().hex[:8]}"
    body = delivery(event(), idempotency_key=key)
    first = raw_post(services.ports["push"], body, host=b"events.example.com")
    second = raw_post(services.ports["flask"], body, host=b"events.example.com")
    assert (first.status, second.status) == (200, 200)
    assert (first.json()["outcome"], second.json()["outcome"]) == ("processed", "duplicate")
    assert len(services.stored(key)) == 1  # what the refused-host tests find absent


def test_an_apps_own_session_interface_runs_on_a_real_service(services: Services) -> None:
    key = f"gss-{uuid.uuid4().hex[:8]}"
    body = delivery(event(), idempotency_key=key)
    answer = raw_post(services.ports["sessions"], body)
    assert answer.status == 200 and answer.json()["outcome"] == "processed"
    assert answer.headers.get("x-session") == "saved"
    again = raw_post(services.ports["flask"], body)
    assert again.json()["outcome"] == "duplicate" and "x-session" not in again.headers


RAW_HEADERS = {
    "CR in the request id": b"X-Request-Id: req\rinjected",
    "LF in the request id": b"X-Request-Id: req\ninjected",
    "CR LF in the request id": b"X-Request-Id: req\r\nX-Injected: 1",
    "CR in the trace": b"X-Cloud-Trace-Context: 0af7651916cd43dd\r/1",
    "NUL in the request id": b"X-Request-Id: req\x00id",
    "obs-fold": b"X-Request-Id: req\r\n folded",
    "latin-1 byte in the request id": b"X-Request-Id: r\xe9q",
    "tab in the request id": b"X-Request-Id: req\tid",
}
"""Header bytes a client library refuses to send (or sends otherwise): written raw, each to
both routes. gunicorn refuses most itself (400, "Invalid HTTP Header"); CR LF ends a header,
and the tab and the latin-1 byte reach the app, whose unusable id is replaced."""


@pytest.mark.parametrize("line", list(RAW_HEADERS.values()), ids=list(RAW_HEADERS))
def test_a_raw_header_gets_the_same_answer_on_both_routes(services: Services,
                                                          line: bytes) -> None:
    key = f"raw-{uuid.uuid4().hex[:8]}"
    answers = {route: raw_post(services.ports[route],
                               delivery(event(), idempotency_key=key + route), line)
               for route in ("push", "flask")}
    push, through_flask = answers["push"], answers["flask"]
    assert push.status == through_flask.status
    if push.headers.get("content-type") == "application/json":
        assert push.json("push") == through_flask.json("flask")
        # An id the service cannot send back in a header is replaced, never echoed.
        assert "\r" not in push.headers.get("x-request-id", "")
    else:  # gunicorn refused the request itself: neither app saw it
        assert push.status == 400 and push.body == through_flask.body
