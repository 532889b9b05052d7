"""Outbound HTTP calls with a total deadline: connect, send and every read end by one moment.

requests (and urllib3 under it) bound each socket operation, not the call: a
server that sends its headers and then one byte a second never trips a 3 s read
timeout, and holds the calling thread, and through the lease heartbeat the
event, for as long as it likes. Neither library offers a total deadline, so this
module adds the small part they lack, on their public extension points (an
``HTTPAdapter`` whose pool manager makes connections of our classes):

* each call gets a ``Watch`` with its deadline, and the connections it uses
  attach to it (``connect`` and ``request`` of ``_WatchedConnection``);
* a timer fires at the deadline and shuts the attached socket down, which ends a
  blocked connect, send or read at once;
* the call then raises ``DeadlineExceeded`` (a ``requests.Timeout``, so callers
  that treat a timeout as transient keep doing so).

Per-operation timeouts stay as well (both set to the whole deadline), so a call
that cannot be interrupted (name resolution) is still bounded by them.

Imports: the standard library, requests and urllib3; nothing of ``eventbus``.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class DeadlineExceeded(requests.Timeout):
    """Raised when an outbound call did not finish within its total deadline."""


class Watch:
    """One call's deadline and the connections it uses, shut down when it passes."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.expired = False
        self._lock = threading.Lock()
        self._connections: list[HTTPConnection] = []
        self._done = False

    def attach(self, connection: HTTPConnection) -> None:
        """Watch ``connection`` (shut it down now if the deadline already passed)."""
        with self._lock:
            self._connections.append(connection)
            late = self.expired and not self._done
        if late:
            _shutdown(connection)

    def expire(self) -> None:
        """The deadline passed: end every blocked operation of the call still running."""
        with self._lock:
            if self._done:
                return  # finished in time; its connection is back in the pool
            self.expired = True
            connections = list(self._connections)
        for connection in connections:
            _shutdown(connection)

    def finish(self) -> None:
        """The call returned: the timer must no longer touch its connections."""
        with self._lock:
            self._done = True


def _shutdown(connection: HTTPConnection) -> None:
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing is blocked on it
            sock.shutdown(socket.SHUT_RDWR)


_CURRENT: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "eventbus_deadline_watch", default=None)


class _WatchedConnection(HTTPConnection):
    """A urllib3 connection that attaches itself to the calling thread's ``Watch``."""

    def connect(self) -> None:
        super().connect()
        self._attach()

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._attach()
        super().request(*args, **kwargs)

    def _attach(self) -> None:
        watch = _CURRENT.get()
        if watch is not None:
            watch.attach(self)


class _WatchedHTTPSConnection(_WatchedConnection, HTTPSConnection):
    """The HTTPS variant of ``_WatchedConnection``."""


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections a call's ``Watch`` can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Create the pool manager, making connection pools of the watched classes."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedPool,
                                                   "https": _WatchedHTTPSPool}


def session() -> requests.Session:
    """A requests session whose calls through ``request`` honour a total deadline."""
    made = requests.Session()
    for prefix in ("http://", "https://"):
        made.mount(prefix, DeadlineAdapter())
    return made


def request(http: requests.Session, method: str, url: str, *, total: float,
            **kwargs: Any) -> requests.Response:
    """``http.request(method, url, ...)`` that ends within ``total`` seconds, answer included.

    ``http`` must come from ``session()`` for the deadline to interrupt a
    trickling answer; any other session gets only per-operation timeouts.
    Raises ``DeadlineExceeded`` past the deadline, other ``requests`` errors as usual.
    """
    watch = Watch(total)
    token = _CURRENT.set(watch)
    timer = threading.Timer(total, watch.expire)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
        return http.request(method, url, timeout=(total, total), **kwargs)
    except requests.RequestException as exc:
        if watch.expired:
            raise DeadlineExceeded(f"{method} {url}: no complete answer within {total:g} s "
                                   f"(gave up after {time.monotonic() - started:.1f} s)") from exc
        raise
    finally:
        watch.finish()
        timer.cancel()
        _CURRENT.reset(token)
