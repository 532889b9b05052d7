"""Outbound HTTP calls that end by one moment (connect, send, every read) and read a capped answer.

requests (and urllib3 under it) bound each socket operation, not the call: a
server that sends its headers and then one byte a second never trips a 3 s read
timeout, and holds the calling thread, and through the lease heartbeat the
event, for as long as it likes. Nor do they cap an answer's size: a server may
send gigabytes in the time allowed. Neither library offers a total deadline or
a cap, so this module adds the small part they lack, on their public extension
points (an ``HTTPAdapter`` whose pool manager makes connections of our
classes, and its ``build_response`` hook):

* each call gets a ``Watch`` with its deadline; the connections it uses attach
  to it (``connect`` and ``request`` of ``_WatchedConnection``), and each
  answer is handed over to it as soon as its headers are in (``build_response``);
* a timer fires at the deadline and shuts down what the call is blocked on: the
  attached connection's socket (connect, TLS handshake, send, headers), or the
  answer's socket through urllib3's public ``HTTPResponse.shutdown()`` (the
  body). The answer must be watched itself, not through its connection: when
  the server closes after the answer (HTTP/1.0, ``Connection: close``),
  http.client hands the socket to the answer and urllib3 clears
  ``connection.sock``, so a watch on the connection finds nothing to shut down
  while the body trickles in (a 3 s call was held 16 s that way);
* the call then raises ``DeadlineExceeded`` (a ``requests.Timeout``, so callers
  that treat a timeout as transient keep doing so), also when the cut made a
  close-delimited body look complete;
* every answer, redirects included, is read through ``_CappedAnswer``, a thin
  stand-in for urllib3's response in ``Response.raw`` that counts the bytes
  read (decoded, as they are held) and raises ``AnswerTooLarge`` past
  ``max_bytes`` (at once when the declared ``Content-Length`` is already
  larger, as urllib3 parsed it: a hostile ``Content-Length`` such as ``²`` or
  5,000 digits is no length at all, and the body is read under the cap). It
  is hand-written because neither library has a size limit; it delegates
  everything else to the urllib3 response.

**No wiring can lose the deadline.** It holds only for calls whose transport
is a ``DeadlineAdapter``, so the library never trusts a session it did not
check: ``Client`` owns its session (``session()``, or the app's, taken over
by ``adopt``), and ``request`` adopts whatever session it is given. ``adopt``
walks every adapter the session mounts, through wrappers (an adapter that
sends through another names it ``inner``, as
``eventbus.correlation.session.LoggingAdapter`` does): a ``DeadlineAdapter``
is kept, a plain ``requests`` ``HTTPAdapter`` (what every session mounts) is
replaced by a ``DeadlineAdapter`` with its retries and pool size, and
anything else (another transport, an ``HTTPAdapter`` subclass, a wrapper
that hides what it sends through) raises ``UnboundedSession``: the app
learns it at start-up, where it builds its ``Client``, not from a partner
that trickles. The app's hooks run inside the call, under its deadline.
A call whose answer did not come through a ``DeadlineAdapter`` after all
(a wrapper that sent elsewhere) raises ``UnboundedSession`` too.
The async form, on httpx, is ``eventbus.http.deadline_async``.

The timer covers the whole call, redirects included: every hop's connection
and answer attach to the same ``Watch``. A connection made late in the call
gets only the time left as its connect timeout. Per-operation timeouts stay
as well (both set to the whole deadline). Not bounded: name resolution
(``getaddrinfo`` has no timeout), and a host with several addresses gets the
time left for each connect attempt.

Needs urllib3 2.3 or later (``HTTPResponse.shutdown``).
Imports: the standard library, requests and urllib3; nothing of ``eventbus``.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import requests
from requests.adapters import DEFAULT_POOLBLOCK, DEFAULT_POOLSIZE, BaseAdapter, HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.response import BaseHTTPResponse, HTTPResponse

MAX_ANSWER_BYTES = 1024 * 1024
"""The default cap on an answer's body (decoded): far above a partner's or Google's answers."""
_READ_CHUNK = 64 * 1024
_MIN_CONNECT_TIMEOUT = 0.001  # a zero timeout would make the socket non-blocking


class DeadlineExceeded(requests.Timeout):
    """Raised when an outbound call did not finish within its total deadline."""


class AnswerTooLarge(requests.RequestException):
    """Raised when an answer's body is larger than the call's ``max_bytes``.

    ``status_code`` is the answer's status: its head came whole, only its body
    was cut, so a caller that needs no body may still act on the status.
    """

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class UnboundedSession(TypeError):
    """Raised for a session (or client) whose transport cannot honour a call's deadline and cap.

    Raised where the session is checked, naming the adapter and what to mount
    instead: when a ``Client`` is built (the app's start-up), by ``request``
    given such a session, and at a call whose answer came around its
    ``DeadlineAdapter``. Never a reason to make the call anyway.
    """


class Watch:
    """One call's deadline and cap, and the sockets to shut down when the deadline passes."""

    def __init__(self, total: float, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.total, self.max_bytes = total, max_bytes
        self.ends = time.monotonic() + total
        self.expired = False
        self._lock = threading.Lock()
        self._connections: set[HTTPConnection] = set()
        self._answers: list[BaseHTTPResponse] = []
        self._done = False

    def remaining(self) -> float:
        """Seconds left until the deadline (negative once it passed)."""
        return self.ends - time.monotonic()

    def attach(self, connection: HTTPConnection) -> None:
        """Watch ``connection`` (shut it down now if the deadline already passed)."""
        with self._lock:
            self._connections.add(connection)
            late = self._late()
        if late:
            _shutdown_connection(connection)

    def hand_over(self, answer: BaseHTTPResponse) -> None:
        """The answer's headers are in: from now on its socket is the answer's to shut down."""
        with self._lock:
            # Once released, the connection may serve another call; only the answer,
            # which refuses a shutdown after its release, is safe to keep.
            self._connections.discard(cast(HTTPConnection, answer.connection))
            self._answers.append(answer)
            late = self._late()
        if late:
            _shutdown_answer(answer)

    def expire(self) -> None:
        """The deadline passed: end every blocked operation of the call still running."""
        with self._lock:
            if self._done:
                return  # finished in time; its connection is back in the pool
            self.expired = True
            connections, answers = list(self._connections), list(self._answers)
        for connection in connections:
            _shutdown_connection(connection)
        for answer in answers:
            _shutdown_answer(answer)

    def finish(self) -> bool:
        """The call returned: the timer must no longer touch its sockets. True if it had."""
        with self._lock:
            self._done = True
            return self.expired

    def _late(self) -> bool:
        return self.expired and not self._done


def _shutdown_connection(connection: HTTPConnection) -> None:
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing is blocked on it
            sock.shutdown(socket.SHUT_RDWR)


def _shutdown_answer(answer: BaseHTTPResponse) -> None:
    # RuntimeError: already released to the pool; ValueError: already closed.
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        answer.shutdown()


_CURRENT: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "eventbus_deadline_watch", default=None)


class _WatchedConnection(HTTPConnection):
    """A urllib3 connection that attaches itself to the calling thread's ``Watch``."""

    def connect(self) -> None:
        watch = _CURRENT.get()
        if watch is not None:
            # A redirect's connection must not get the whole deadline again.
            self.timeout = max(_MIN_CONNECT_TIMEOUT, min(watch.total, watch.remaining()))
            watch.attach(self)  # before: a TLS handshake runs on self.sock and is cut too
        super().connect()
        if watch is not None:
            watch.attach(self)  # after: the deadline may have passed while sock was unset

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch = _CURRENT.get()
        if watch is not None:
            watch.attach(self)  # a pooled connection is not connected again
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(_WatchedConnection, HTTPSConnection):
    """The HTTPS variant of ``_WatchedConnection``."""


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _CappedAnswer:
    """``Response.raw``: urllib3's response, whose body reads raise ``AnswerTooLarge`` past a cap.

    requests reads a body through ``raw.stream`` (or ``raw.read``); both count
    here. Every other attribute is the urllib3 response's own.
    """

    def __init__(self, raw: BaseHTTPResponse, limit: int, url: str) -> None:
        self._raw, self._limit, self._url, self._seen = raw, limit, url, 0
        self._declared_checked = False

    def stream(self, amt: int | None = _READ_CHUNK,
               decode_content: bool | None = None) -> Iterator[bytes]:
        """Yield the body as urllib3's ``stream`` does, counting it against the cap."""
        self._check_declared()
        for chunk in self._raw.stream(amt, decode_content=decode_content):
            yield self._count(chunk)

    def read(self, amt: int | None = None, decode_content: bool | None = None,
             cache_content: bool = False) -> bytes:
        """Read as urllib3's ``read`` does; a read to the end stops one byte past the cap."""
        self._check_declared()
        if amt is not None:
            return self._count(self._raw.read(amt, decode_content=decode_content))
        chunks = []
        while chunk := self._raw.read(_READ_CHUNK, decode_content=decode_content):
            chunks.append(self._count(chunk))
        return b"".join(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def _check_declared(self) -> None:
        # urllib3's parse of Content-Length (None for "²", 5,000 digits, "-5": no
        # length, read under the cap), before any byte of the body is read.
        if self._declared_checked:
            return
        self._declared_checked = True
        declared = self._raw.length_remaining
        if declared is not None and declared > self._limit:
            raise self._too_large(f"declares {declared} bytes, more")

    def _count(self, chunk: bytes) -> bytes:
        self._seen += len(chunk)
        if self._seen > self._limit:
            raise self._too_large("sent more")
        return chunk

    def _too_large(self, what: str) -> AnswerTooLarge:
        self._raw.close()  # the rest is never read: the connection cannot serve another call
        return AnswerTooLarge(f"the {self._raw.status} answer from {self._url} {what} "
                              f"than its {self._limit}-byte cap", status_code=self._raw.status)


class DeadlineAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections and answers a call's ``Watch`` can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Create the pool manager, making connection pools of the watched classes."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """The manager for ``proxy``; through an HTTP(S) proxy, connections are watched too."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools make their own connections
            manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager

    def build_response(self, req: requests.PreparedRequest, resp: Any) -> requests.Response:
        """Build the response; under a ``Watch``, hand the answer to it and cap its body."""
        response = super().build_response(req, resp)
        watch = _CURRENT.get()
        if watch is not None and isinstance(resp, BaseHTTPResponse):
            watch.hand_over(resp)
            response.raw = cast(HTTPResponse, _CappedAnswer(resp, watch.max_bytes, response.url))
        return response


def session() -> requests.Session:
    """A requests session whose calls through ``request`` honour a total deadline and a cap."""
    made = requests.Session()
    for prefix in ("http://", "https://"):
        made.mount(prefix, DeadlineAdapter())
    return made


def adopt(http: requests.Session) -> requests.Session:
    """Make every adapter ``http`` mounts honour the deadline and cap; return ``http``.

    The rule is in the module docstring: ``DeadlineAdapter`` kept, a plain
    ``HTTPAdapter`` replaced (inside its wrappers), anything else refused with
    ``UnboundedSession``. Adopting twice changes nothing.
    """
    for prefix, adapter in list(http.adapters.items()):
        bounded = _bounded(prefix, adapter)
        if bounded is not adapter:
            http.mount(prefix, bounded)
    return http


def _bounded(prefix: str, adapter: BaseAdapter) -> BaseAdapter:
    if isinstance(adapter, DeadlineAdapter):
        return adapter
    if type(adapter) is HTTPAdapter:
        # Its pool size and blocking are public on its pool manager; the number
        # of hosts it pools is not, so the replacement keeps requests' default.
        pool = adapter.poolmanager.connection_pool_kw
        return DeadlineAdapter(max_retries=adapter.max_retries,
                               pool_maxsize=pool.get("maxsize", DEFAULT_POOLSIZE),
                               pool_block=pool.get("block", DEFAULT_POOLBLOCK))
    inner = getattr(adapter, "inner", None)
    if isinstance(inner, BaseAdapter):
        bounded = _bounded(prefix, inner)
        if bounded is not inner:
            adapter.inner = bounded  # type: ignore[attr-defined]  # the wrapper's own field
        return adapter
    kind = f"{type(adapter).__module__}.{type(adapter).__qualname__}"
    raise UnboundedSession(
        f"the session's adapter for {prefix!r} is a {kind}, which cannot end a call at its "
        "total deadline or cap its answer: mount an eventbus.http.deadline.DeadlineAdapter there "
        "(or wrap one, naming it `inner`), or leave requests' own HTTPAdapter to be replaced")


class Client:
    """An HTTP client the library owns: every call ends within its deadline, its answer capped.

    ``http`` (default a new ``session()``) is taken over: ``adopt`` makes its
    adapters honour the deadline or refuses it here, with
    ``UnboundedSession``, so an app learns at start-up that its wiring
    cannot be bounded. Its headers, hooks, proxies and wrappers (logging)
    stay as they are and run inside each call's deadline.
    """

    def __init__(self, http: requests.Session | None = None, *,
                 max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.session = adopt(http) if http is not None else session()
        self.max_bytes = max_bytes

    def request(self, method: str, url: str, *, total: float, **kwargs: Any) -> requests.Response:
        """``request(self.session, method, url, total=total, ...)`` with this client's cap."""
        kwargs.setdefault("max_bytes", self.max_bytes)
        return request(self.session, method, url, total=total, **kwargs)

    def close(self) -> None:
        """Close the session's pooled connections."""
        self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(http: requests.Session, method: str, url: str, *, total: float,
            max_bytes: int = MAX_ANSWER_BYTES, **kwargs: Any) -> requests.Response:
    """``http.request(method, url, ...)`` that ends within ``total`` seconds, answer included.

    The whole answer is read before returning (``stream`` is not accepted), and
    every answer of the call, redirects included, is capped at ``max_bytes``.
    ``http`` is adopted first (``adopt``: its plain adapters made to honour
    the deadline, any other refused with ``UnboundedSession``), so no session
    gets only per-operation timeouts. Raises ``DeadlineExceeded`` past the
    deadline, ``AnswerTooLarge`` past the cap, other ``requests`` errors as usual.
    """
    adopt(http)
    watch = Watch(total, max_bytes)
    token = _CURRENT.set(watch)
    timer = threading.Timer(total, watch.expire)
    timer.daemon = True
    timer.start()
    try:
        response = http.request(method, url, timeout=(total, total), stream=True, **kwargs)
        _read_whole(response)
    except Exception as exc:
        if watch.finish() or watch.remaining() <= 0:
            raise _exceeded(method, url, watch) from exc
        raise
    finally:
        watch.finish()
        timer.cancel()
        _CURRENT.reset(token)
    if watch.expired:  # the cut may have ended a close-delimited body early: not a whole answer
        raise _exceeded(method, url, watch)
    if not isinstance(response.raw, _CappedAnswer):
        response.close()  # a wrapper sent through something else than the adapter it named
        raise UnboundedSession(f"{method} {url}: the answer did not come through a "
                               "DeadlineAdapter; the session's wrappers must send through "
                               "the adapter they name `inner`")
    return response


def _read_whole(response: requests.Response) -> None:
    try:
        response.content  # noqa: B018 (read and kept by requests) inside the deadline
    except BaseException:
        response.close()
        raise


def _exceeded(method: str, url: str, watch: Watch) -> DeadlineExceeded:
    spent = watch.total - watch.remaining()
    return DeadlineExceeded(f"{method} {url}: no complete answer within {watch.total:g} s "
                            f"(gave up after {spent:.1f} s)")
