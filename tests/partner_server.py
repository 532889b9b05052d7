"""A scripted partner endpoint: a real local HTTP server that fails on cue.

``PartnerServer(script, then=200)`` answers each POST with the next action of
``script``, then ``then`` forever. An action is a status code, or
``Slow(seconds, status)``: sleep first, so a client with a shorter timeout
gives up; ``Trickle(every)``: send the body (with ``headers_too`` the headers
as well) one byte every ``every`` seconds, which no read timeout trips.
Every request is recorded with its headers and JSON body.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclasses.dataclass(frozen=True)
class Slow:
    """Answer ``status`` after ``seconds``."""

    seconds: float
    status: int = 200


@dataclasses.dataclass(frozen=True)
class Trickle:
    """Answer ``status`` one byte every ``every`` seconds: the body, or the headers too."""

    every: float = 1.0
    status: int = 200
    headers_too: bool = False
    length: int = 60


@dataclasses.dataclass(frozen=True)
class Later:
    """Answer ``status`` with a ``Retry-After: retry_after`` header."""

    status: int
    retry_after: str


Action = int | Slow | Trickle | Later


@dataclasses.dataclass(frozen=True)
class Call:
    """One request the partner received and the status it answered."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int

    @property
    def key(self) -> str:
        """The ``Idempotency-Key`` header."""
        return self.headers.get("Idempotency-Key", "")


class PartnerServer:
    """A threading HTTP server on a free port, answering a script of actions."""

    def __init__(self, script: Iterable[Action] = (), then: Action = 200) -> None:
        self._script, self._then = iter(script), then
        self._calls: list[Call] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        """Base URL without a trailing slash."""
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def template(self) -> str:
        """An ``EVENTBUS_PARTNER_URL`` template pointing here."""
        return f"{self.url}/partners/{{partnerId}}/events"

    @property
    def calls(self) -> list[Call]:
        """The requests received so far, oldest first."""
        with self._lock:
            return list(self._calls)

    def successes(self) -> Counter[str]:
        """How many 2xx answers each ``Idempotency-Key`` got."""
        return Counter(call.key for call in self.calls if 200 <= call.status < 300)

    def __enter__(self) -> PartnerServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self) -> Action:
        with self._lock:
            return next(self._script, self._then)

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        partner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = partner._next()
                status = action if isinstance(action, int) else action.status
                partner._record(Call(self.path, dict(self.headers.items()),
                                     json.loads(body or b"null"), status))
                if isinstance(action, Trickle):
                    self._trickle(action)
                    return
                if isinstance(action, Slow):
                    time.sleep(action.seconds)
                try:
                    self.send_response(status)
                    if isinstance(action, Later):
                        self.send_header("Retry-After", action.retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up first: that was the point

            do_GET = do_POST  # noqa: N815 (http.server's name) a certificate endpoint trickles too

            def _trickle(self, action: Trickle) -> None:
                head = (f"HTTP/1.1 {action.status} OK\r\nContent-Length: {action.length}\r\n"
                        "\r\n").encode()
                if not action.headers_too:
                    self.wfile.write(head)
                    head = b""
                try:
                    for byte in head + b"x" * action.length:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(action.every)
                except OSError:
                    pass  # the client gave up: that was the point

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
