"""Helpers shared by the end-to-end tests of the real service (not fixtures).

- ``service_env``: the environment of a ``main:app`` service under test.
- ``module_database``: a uniquely named database for one test module.
- ``event`` / ``wrapped_body`` / ``post``: build events and push them over HTTP.
- ``stored_key``: the key the service stores a published event under (partner-scoped).
- ``request_lines``: the service's per-request JSON log lines.
- ``effect_runs`` / ``record_of`` / ``wait_for_status``: read what happened in MongoDB.
- ``TcpProxy`` / ``proxied_uri``: a MongoDB connection that a test can cut and restore.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from pymongo import MongoClient
from pymongo.database import Database

from eventbus.model.event import parse_event
from eventbus.model.keys import record_key
from eventbus.model.order import entity_key
from tests.e2e import fault_handlers
from tests.e2e.harness import E2E_PROJECT, ServiceProcess, unavailable, wait_until

# Extra handler modules: the app always has its own handlers; these add the fault handlers.
HANDLER_MODULES = "tests.e2e.fault_handlers"


def service_env(mongo_uri: str, db_name: str, emulator: str, **extra: str) -> dict[str, str]:
    """Environment of a service on ``db_name`` with the fault handlers loaded.

    Publishing (the inline relay) is off and pinned to the emulator, so
    nothing here can reach a real Pub/Sub project or other tests' topics.
    """
    return {
        "MONGODB_URI": mongo_uri,
        "MONGODB_DB": db_name,
        "EVENTBUS_HANDLER_MODULES": HANDLER_MODULES,
        "EVENTBUS_RELAY_INLINE": "false",
        "PUBSUB_EMULATOR_HOST": emulator,
        "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
        "PUBSUB_TOPIC": f"e2e-unrouted-{uuid.uuid4().hex[:8]}",
        **extra,
    }


def module_database(client: MongoClient, prefix: str) -> Iterator[Database]:
    """Yield a fresh database named ``<prefix>_<random>``; drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    yield client[name]
    client.drop_database(name)


def event(event_type: str, **data: Any) -> dict[str, Any]:
    """A valid seed-002 event of ``event_type`` whose ``entity_data`` is ``data``."""
    entity = str(data.get("tag", "e-1"))
    return {
        "event_type": event_type,
        "event_version": "v1",
        "event_direction": "IN",
        "entity_metadata": {
            "partnerId": "partner-e2e",
            "partnerName": "E2E Partner",
            "entity_id": entity,
            "entity_type": "Test",
        },
        "entity_data": data,
    }


def encode(payload: Mapping[str, Any]) -> bytes:
    """The message data a publisher sends for ``payload``."""
    return json.dumps(payload).encode()


def stored_key(payload: Mapping[str, Any], attributes: Mapping[str, str]) -> str:
    """The key the service stores ``payload`` under when published with ``attributes``.

    The library's own rule: a publisher's key (given or derived) scoped by partner.
    """
    return record_key(parse_event(encode(payload), attributes), attributes)


def wrapped_body(payload: Mapping[str, Any], message_id: str, **attributes: str) -> bytes:
    """A wrapped push body, as the emulator sends it."""
    message = {
        "data": base64.b64encode(encode(payload)).decode(),
        "messageId": message_id,
        "publishTime": "2026-11-22T10:00:00.000Z",
        "attributes": attributes,
    }
    return json.dumps({"message": message, "subscription": "projects/p/subscriptions/s"}).encode()


def ordered_delivery(event_type: str, entity: str, seq: int, message_id: str,
                     **data: Any) -> tuple[bytes, str]:
    """The wrapped push of ``entity``'s event ``seq`` (key ``<entity>-<seq>``), and its record's
    key; ``data`` joins ``tag`` and ``seq`` in ``entity_data``."""
    payload = event(event_type, tag=entity, seq=seq, **data)
    name = f"{entity}-{seq}"
    return (wrapped_body(payload, message_id, idempotency_key=name),
            stored_key(payload, {"idempotency_key": name}))


def stored_position(db: Database, entity: str) -> Any:
    """The applied position in the record of ``entity`` (an ``event``'s, by its ``tag``): the
    framework's, not a handler's."""
    record = db.partner_events.find_one(
        {"idempotency_key": entity_key("partner-e2e", "Test", entity)})
    return (record or {}).get("position")


def post(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to ``url`` (``http://host:port``) on a new connection; status and JSON."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    return response.status, json.loads(raw) if raw else {}


def request_lines(service: ServiceProcess, key: str | None = None) -> list[dict[str, Any]]:
    """The service's ``REQUEST_INBOUND`` log lines, oldest first; only ``key``'s if given."""
    try:
        text = service.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    lines = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("logType") == "REQUEST_INBOUND":
                lines.append(entry)
    return [e for e in lines if key is None or e.get("idempotency_key") == key]


def wait_for_outcome(
    service: ServiceProcess, key: str, outcome: str, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Wait until the service logged ``outcome`` for ``key``; return all of ``key``'s lines."""

    def logged() -> list[dict[str, Any]] | None:
        lines = request_lines(service, key)
        return lines if any(line.get("outcome") == outcome for line in lines) else None

    return wait_until(logged, timeout=timeout, message=f"a {outcome!r} line for {key}")


def effect_runs(db: Database, tag: str) -> int:
    """How many times a fault handler's effect ran for ``tag``."""
    doc = db[fault_handlers.EFFECTS].find_one({"_id": tag})
    return int(doc["runs"]) if doc else 0


def record_of(db: Database, key: str) -> dict[str, Any] | None:
    """The ``partner_events`` record of ``key``."""
    record: dict[str, Any] | None = db.partner_events.find_one({"idempotency_key": key})
    return record


def wait_for_status(db: Database, key: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until ``key``'s record has ``event_status`` ``status``; return the record."""

    def reached() -> dict[str, Any] | None:
        record = record_of(db, key)
        return record if record and record.get("event_status") == status else None

    return wait_until(reached, timeout=timeout, message=f"{key} to be {status}")


# --- a MongoDB connection a test can cut -------------------------------------

_URI = re.compile(r"mongodb://(?P<creds>[^@/]*@)?(?P<hosts>[^/?]*)(?P<rest>.*)")


def mongo_address(uri: str) -> tuple[str, int]:
    """The first host and port of a ``mongodb://`` URI."""
    match = _URI.fullmatch(uri)
    if match is None:
        unavailable(f"cannot put a TCP proxy in front of {uri.split('@')[-1]!r}")
    first = match["hosts"].split(",")[0]
    if first.startswith("["):  # [ipv6]:port
        host, _, after = first[1:].partition("]")
        port = after.removeprefix(":")
    else:
        host, _, port = first.partition(":")
    return host, int(port or 27017)


def proxied_uri(uri: str, port: int) -> str:
    """``uri`` pointed at ``127.0.0.1:port`` with ``directConnection=true``.

    Only the first host is proxied: for a replica set, list its primary first.
    """
    match = _URI.fullmatch(uri)
    if match is None:
        unavailable(f"cannot put a TCP proxy in front of {uri.split('@')[-1]!r}")
    path, _, query = match["rest"].partition("?")
    options = [part for part in query.split("&") if part and not part.startswith("replicaSet=")]
    options.append("directConnection=true")
    return f"mongodb://{match['creds'] or ''}127.0.0.1:{port}{path or '/'}?{'&'.join(options)}"


class TcpProxy:
    """A local TCP forwarder to ``target`` that can be cut (every connection dropped,
    new ones closed at once) and restored, like a server that goes away and comes back.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._open = threading.Event()
        self._open.set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)

    @property
    def port(self) -> int:
        """The local port to connect to."""
        port: int = self._listener.getsockname()[1]
        return port

    def start(self) -> TcpProxy:
        """Start accepting connections."""
        self._acceptor.start()
        return self

    def cut(self) -> None:
        """Drop every open connection and refuse (accept-and-close) new ones."""
        self._open.clear()
        with self._lock:
            doomed, self._sockets = self._sockets, set()
        for sock in doomed:
            _shut(sock)

    def restore(self) -> None:
        """Forward new connections again."""
        self._open.set()

    def close(self) -> None:
        """Cut, stop accepting and wait for every forwarding thread to end."""
        self._closing.set()
        self.cut()
        self._acceptor.join(timeout=5)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._open.is_set():
                _shut(client)
                continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _shut(client)
            return
        client.settimeout(None)
        upstream.settimeout(None)
        with self._lock:
            self._sockets.update((client, upstream))
        for src, dst in ((client, upstream), (upstream, client)):
            thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update((src, dst))
            for sock in (src, dst):
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
