"""The TCP server: accept loop, one thread per client connection, orderly shutdown.

A connection thread reads a frame, runs the command, writes the reply. What
ends a connection: the client closing it, a frame that cannot be trusted
(impossible length, truncated message), or a socket error. Nothing a client
sends ends the gateway.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from typing import BinaryIO

from localdb.gateway import commands, wire
from localdb.gateway.config import GatewayConfig
from localdb.gateway.context import Client, GatewayState
from localdb.gateway.errors import MongoError

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0


class Server:
    """Listens for MongoDB clients and serves each on its own thread."""

    def __init__(self, config: GatewayConfig, state: GatewayState | None = None):
        self.config = config
        self.state = state or GatewayState(config)
        self._listener: socket.socket | None = None
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._clients: dict[threading.Thread, socket.socket] = {}

    def bind(self) -> tuple[str, int]:
        """Open the listening socket; the (host, port) it got (port 0 picks one)."""
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.config.host, self.config.port))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        host, port = listener.getsockname()[:2]
        return host, port

    def serve_forever(self) -> None:
        """Accept clients until `shutdown`; then disconnect them and release everything."""
        listener = self._listener
        if listener is None:
            raise RuntimeError("bind() first")
        reaper = threading.Thread(target=self._reap, name="reaper", daemon=True)
        reaper.start()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(listener, selectors.EVENT_READ)
                selector.register(self._wake_reader, selectors.EVENT_READ)
                while not self._stopping.is_set():
                    if any(key.fileobj is listener for key, _ in selector.select()):
                        self._accept(listener)
        finally:
            self._close(listener)

    def shutdown(self) -> None:
        """Make `serve_forever` return; safe from a signal handler or any thread."""
        self._stopping.set()
        with contextlib.suppress(OSError):  # already closed: serve_forever has finished
            self._wake_writer.send(b"\x00")

    def _accept(self, listener: socket.socket) -> None:
        """Start a thread for one new client."""
        try:
            sock, address = listener.accept()
        except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
            log.warning("accept failed: %s", exc)
            time.sleep(0.1)
            return
        peer = f"{address[0]}:{address[1]}"
        client = Client(next(self.state.connection_ids), peer)
        thread = threading.Thread(target=self._serve, args=(sock, client),
                                  name=f"conn{client.connection_id}", daemon=True)
        with self._lock:
            self._clients[thread] = sock
        thread.start()

    def _serve(self, sock: socket.socket, client: Client) -> None:
        """Thread body: serve one client, then forget it."""
        log.debug("connection %d from %s", client.connection_id, client.peer)
        try:
            serve_connection(self.state, sock, client)
        finally:
            sock.close()
            with self._lock:
                self._clients.pop(threading.current_thread(), None)
            log.debug("connection %d closed", client.connection_id)

    def _reap(self) -> None:
        """Periodically end idle transactions and cursors."""
        while not self._stopping.wait(self.config.reap_interval_s):
            try:
                self.state.reap()
            except Exception:  # a failed sweep must not stop future ones
                log.exception("reaping idle transactions/cursors failed")

    def _close(self, listener: socket.socket) -> None:
        """Stop listening, disconnect clients, wait for their threads, release state."""
        listener.close()
        with self._lock:
            clients = dict(self._clients)
        for sock in clients.values():
            with contextlib.suppress(OSError):  # the client may be gone already
                sock.shutdown(socket.SHUT_RDWR)  # unblocks the thread's read
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in clients:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.state.close()
        self._wake_reader.close()
        self._wake_writer.close()


def serve_connection(state: GatewayState, sock: socket.socket, client: Client) -> None:
    """Read requests and write replies until the client leaves or the stream breaks."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    try:
        while serve_one(state, sock, reader, client):
            pass
    except wire.FramingError as exc:
        log.warning("closing connection %d from %s: %s", client.connection_id, client.peer, exc)
    except OSError as exc:
        log.debug("connection %d: %s", client.connection_id, exc)
    except Exception:  # a gateway bug: lose this connection, not the gateway
        log.exception("connection %d failed", client.connection_id)
    finally:
        reader.close()


def serve_one(state: GatewayState, sock: socket.socket, reader: BinaryIO,
              client: Client) -> bool:
    """Serve one message; False when the client has closed the connection."""
    head = reader.read(wire.HEADER_BYTES)
    if not head:
        return False
    header = wire.parse_header(head, state.config.max_message_bytes)
    payload = reader.read(header.length - wire.HEADER_BYTES)
    if len(payload) != header.length - wire.HEADER_BYTES:
        raise wire.FramingError(f"truncated message: {len(payload)} of "
                                f"{header.length - wire.HEADER_BYTES} bytes")
    reply = respond(state, client, header, payload)
    if reply is not None:
        sock.sendall(reply)
    return True


def respond(state: GatewayState, client: Client, header: wire.Header,
            payload: bytes) -> bytes | None:
    """The reply message for one request (None when the client wants none)."""
    try:
        request = wire.parse_message(header, payload)
    except wire.MessageError as exc:
        log.info("refusing a message from %s: %s", client.peer, exc)
        document = wire.encode(MongoError(exc.code, str(exc)).to_document())
        if exc.legacy:
            return wire.op_reply(header.request_id, document, failure=True)
        return wire.op_msg_reply(header.request_id, document)
    document = commands.execute(state, client, request)
    if request.more_to_come:
        return None
    if request.legacy:
        return wire.op_reply(request.request_id, document)
    return wire.op_msg_reply(request.request_id, document)
