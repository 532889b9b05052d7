"""A hostile HTTP server on a raw local socket: it answers exactly the bytes a test scripts.

``http.server`` always speaks its own HTTP/1.x framing; an attacker does not.
``HostileServer(behaviour)`` accepts connections on a free port, reads each
request's head and body, and hands the connected socket to ``behaviour``,
which writes what it likes (``trickle``, ``send``). Every connection runs in
its own daemon thread; leaving the ``with`` block stops the trickles at once
(they wait on an event, not ``time.sleep``), shuts every connection down (a
send or a read blocked on a client that stopped reading ends), joins each
connection's thread and closes the listening socket.

Ready-made behaviours:

* ``trickle_head(every)``: the status line and headers, one byte every ``every`` s;
* ``trickle_body(every, version=..., close=...)``: headers at once, then a
  60-byte body one byte at a time, over HTTP/1.1 keep-alive, HTTP/1.0, or
  HTTP/1.1 with ``Connection: close`` (with or without a ``Content-Length``);
* ``redirect(location, after=...)``: a 302 to ``location``, at once or late;
* ``answer(status, body, ...)``: a complete answer, with a ``Content-Length``,
  chunked, or delimited by closing the connection;
* ``raw(data)``: exactly ``data`` (a head no HTTP library would write), then close.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType

Behaviour = Callable[[socket.socket, threading.Event], None]
TRICKLE_LENGTH = 60


class HostileServer:
    """A listening socket whose every connection gets ``behaviour`` after its request."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._lock = threading.Lock()
        self._connections: list[tuple[socket.socket, threading.Thread]] = []

    @property
    def url(self) -> str:
        """Base URL without a trailing slash."""
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for conn, _ in connections:
            with contextlib.suppress(OSError):  # closed already: its thread ends or has
                conn.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join(timeout=2)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._connections.append((conn, thread))
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                while not self._stop.is_set():
                    head = read_request(conn)
                    if head is None:
                        return
                    self.requests.append(head)
                    self.behaviour(conn, self._stop)
            except OSError:
                return  # the client shut the connection down: that was the point


def read_request(conn: socket.socket) -> bytes | None:
    """Read one request's head and body; ``None`` once the client closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(4096)
    return head


def trickle(conn: socket.socket, stop: threading.Event, data: bytes, every: float) -> None:
    """Send ``data`` one byte every ``every`` seconds (stops early when the server stops)."""
    for byte in data:
        conn.sendall(bytes([byte]))
        if stop.wait(every):
            return


def trickle_head(every: float) -> Behaviour:
    """Trickle the status line and headers themselves."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        trickle(conn, stop, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", every)
    return behave


def trickle_body(every: float, *, version: str = "HTTP/1.1", close: bool = False,
                 length: bool = True) -> Behaviour:
    """Send the headers at once, then the body a byte at a time; close after it if asked."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        headers = [f"{version} 200 OK"]
        if close:
            headers.append("Connection: close")
        if length:
            headers.append(f"Content-Length: {TRICKLE_LENGTH}")
        conn.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        trickle(conn, stop, b"x" * TRICKLE_LENGTH, every)
        if close or version == "HTTP/1.0" or not length:
            conn.shutdown(socket.SHUT_RDWR)
    return behave


def redirect(location: str, *, after: float = 0.0) -> Behaviour:
    """Answer a 302 to ``location``, ``after`` seconds late."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        if stop.wait(after):
            return
        conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\n"
                     "Content-Length: 0\r\n\r\n".encode())
    return behave


def answer(status: int, body: bytes, *, framing: str = "length", extra: str = "") -> Behaviour:
    """Answer ``status`` with ``body`` at once: ``framing`` is length, chunked or close.

    ``extra``: more header lines, each ending in CRLF.
    """
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 {status} X\r\n{extra}"
        if framing == "length":
            conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        elif framing == "chunked":
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096])
                              for i in range(0, len(body), 4096))
            conn.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode()
                         + chunks + b"0\r\n\r\n")
        else:
            conn.sendall(f"{head}Connection: close\r\n\r\n".encode() + body)
            conn.shutdown(socket.SHUT_RDWR)
    return behave


def raw(data: bytes) -> Behaviour:
    """Send ``data`` as it is, then close the connection."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_RDWR)
    return behave
