"""PostgreSQL connections for the gateway: libpq prepared statements, binary BSON, a pool.

The hot path talks to libpq through psycopg's `pgconn` directly: BSON goes in
and comes out as raw bytes in binary format (DocumentDB's `bson` send/recv
format *is* the BSON encoding), statements are prepared once per connection,
and no Python-level type adaptation happens per call. libpq releases the GIL
while it waits, so one thread per client connection scales.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import psycopg
from psycopg import pq

from localdb.gateway.errors import Code, MongoError

log = logging.getLogger(__name__)

Value = bytes | None
Row = tuple[Value, ...]

_INT8 = struct.Struct(">q")
_OK_STATUSES = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement prepared once per connection under `name`; all parameters binary."""

    name: bytes
    sql: bytes


class PgError(Exception):
    """An error raised by PostgreSQL or the engine, with its SQLSTATE and detail."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail


def as_bool(value: Value) -> bool:
    """A binary-format boolean column."""
    return value == b"\x01"


def as_int8(value: Value) -> int:
    """A binary-format bigint column (NULL reads as 0)."""
    return _INT8.unpack(value)[0] if value else 0


def _nullable(params: Sequence[Value]) -> Sequence[bytes]:
    """Parameters as libpq takes them: psycopg's stubs omit that None means NULL."""
    return cast(Sequence[bytes], params)


class PgConnection:
    """One autocommit PostgreSQL session, used by one thread at a time."""

    def __init__(self, dsn: str, connect_timeout: float = 5.0):
        try:
            self._conn = psycopg.connect(dsn, autocommit=True,
                                         connect_timeout=max(1, round(connect_timeout)),
                                         application_name=f"localdb-gateway-{os.getpid()}")
        except psycopg.Error as exc:
            raise PgError("08001", f"cannot connect to PostgreSQL: {exc}") from exc
        self._pq = self._conn.pgconn
        self._prepared: set[bytes] = set()
        self._tune()

    def _tune(self) -> None:
        """Session settings: find deadlocks in milliseconds, not PostgreSQL's 1 s.

        Concurrent inserts of one unique key deadlock in DocumentDB (its unique
        indexes are exclusion constraints); the victim is retried, so the
        sooner it is chosen, the better. Needs superuser; skipped otherwise.
        """
        with contextlib.suppress(PgError):
            self.execute(b"SET deadlock_timeout = '20ms'")

    def run(self, stmt: Statement, params: Sequence[Value]) -> Row:
        """Execute a prepared statement and return its first row (empty if none)."""
        if stmt.name not in self._prepared:
            self._guard(lambda: self._pq.prepare(stmt.name, stmt.sql))
            self._prepared.add(stmt.name)
        result = self._guard(lambda: self._pq.exec_prepared(
            stmt.name, _nullable(params), (1,) * len(params), result_format=1))
        return self._row(result, 0) if result.ntuples else ()

    def execute(self, sql: bytes) -> None:
        """Execute a parameterless utility statement (BEGIN, COMMIT, CALL ...)."""
        self._guard(lambda: self._pq.exec_(sql))

    def _guard(self, call: Callable[[], pq.abc.PGresult]) -> pq.abc.PGresult:
        """Run a libpq call; a lost connection and a failed statement both raise `PgError`."""
        try:
            result = call()
        except psycopg.Error as exc:  # libpq returned no result at all
            raise PgError("08006", f"PostgreSQL connection lost: {exc}") from exc
        self._check(result)
        return result

    @staticmethod
    def _row(result: pq.abc.PGresult, index: int) -> Row:
        """Row `index` of `result` as raw values."""
        return tuple(result.get_value(index, col) for col in range(result.nfields))

    @staticmethod
    def _check(result: pq.abc.PGresult) -> None:
        """Raise `PgError` unless `result` succeeded."""
        if result.status in _OK_STATUSES:
            return
        field = result.error_field
        state = (field(pq.DiagnosticField.SQLSTATE) or b"08006").decode()
        message = field(pq.DiagnosticField.MESSAGE_PRIMARY) or result.error_message
        detail = field(pq.DiagnosticField.MESSAGE_DETAIL)
        raise PgError(state, message.decode(errors="replace"),
                      detail.decode(errors="replace") if detail else None)

    @property
    def usable(self) -> bool:
        """True when the session is connected and not inside a transaction."""
        return (self._pq.status == pq.ConnStatus.OK
                and self._pq.transaction_status == pq.TransactionStatus.IDLE)

    @property
    def stale(self) -> bool:
        """True when an idle session has input waiting: the server ended it (restart,
        shutdown, terminated backend), so it must not be handed out."""
        try:  # poll, not select: descriptors past 1024 are common with many clients
            poller = select.poll()
            poller.register(self._pq.socket, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError, psycopg.Error):
            return True

    @property
    def failed_transaction(self) -> bool:
        """True inside a transaction that an error has aborted."""
        return self._pq.transaction_status == pq.TransactionStatus.INERROR

    def close(self) -> None:
        """Close the session; safe to call twice."""
        self._conn.close()


class Pool:
    """A bounded set of PostgreSQL sessions, opened on demand and reused LIFO."""

    def __init__(self, dsn: str, max_size: int, acquire_timeout: float = 30.0):
        self.dsn = dsn
        self.max_size = max_size
        self._timeout = acquire_timeout
        self._idle: list[PgConnection] = []
        self._size = 0
        self._waiting = 0
        self._closed = False
        # A plain lock for the hot path; the condition (same lock) only for waiters.
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def acquire(self) -> PgConnection:
        """An idle session, else a new one if under the limit, else wait for one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else self._wait_or_reserve()
            if conn is None or not conn.stale:
                break
            self.discard(conn)
        if conn is not None:
            return conn
        try:  # connect outside the lock: it takes milliseconds
            return PgConnection(self.dsn)
        except BaseException:
            self._forget()
            raise

    def _wait_or_reserve(self) -> PgConnection | None:
        """With the lock held: reserve a slot (None) or wait for an idle session."""
        deadline = time.monotonic() + self._timeout
        self._waiting += 1
        try:
            while not self._idle:
                if self._size < self.max_size:
                    self._size += 1
                    return None
                if self._closed or not self._freed.wait(deadline - time.monotonic()):
                    raise MongoError(Code.MaxTimeMSExpired,
                                     f"no PostgreSQL session free within {self._timeout:.0f}s "
                                     f"(pool of {self.max_size})")
            return self._idle.pop()
        finally:
            self._waiting -= 1

    def release(self, conn: PgConnection) -> None:
        """Give a session back; one that is broken or mid-transaction is closed."""
        if self._closed or not conn.usable:
            self.discard(conn)
            return
        with self._lock:
            self._idle.append(conn)
            if self._waiting:
                self._freed.notify()

    def detach(self) -> None:
        """Stop counting a borrowed session: a cursor keeps it, and commands must
        not wait for it."""
        self._forget()

    def adopt(self, conn: PgConnection) -> None:
        """Take a detached session back if there is room for it, else close it."""
        if not self._closed and conn.usable:
            with self._lock:
                if self._size < self.max_size:
                    self._size += 1
                    self._idle.append(conn)
                    if self._waiting:
                        self._freed.notify()
                    return
        conn.close()

    def discard(self, conn: PgConnection) -> None:
        """Close a session that must not be reused and free its slot."""
        conn.close()
        self._forget()

    def _forget(self) -> None:
        """Free the slot of a session that was closed or never opened."""
        with self._lock:
            self._size -= 1
            self._freed.notify()

    def close(self) -> None:
        """Close idle sessions now; busy ones are closed when released."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._freed.notify_all()
        for conn in idle:
            conn.close()
