"""State shared by all connections, and the per-command context handlers receive."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localdb.gateway.config import GatewayConfig
from localdb.gateway.pg import PgConnection, Pool, Row, Statement, Value
from localdb.gateway.sessions import Cursors, Transaction, Transactions
from localdb.gateway.wire import Request

# What a handler returns: a reply document, or one already BSON-encoded (the
# engine's own reply, passed through without decoding).
Reply = dict[str, Any] | bytes


class GatewayState:
    """Everything the connections share: the pool, transactions, cursors."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.pool = Pool(config.dsn, config.pool_size, config.acquire_timeout_s)
        self.transactions = Transactions(self.pool, config.txn_lock_timeout_ms,
                                         config.txn_lifetime_s)
        self.cursors = Cursors(self.pool, config.cursor_timeout_s, config.max_pinned_cursors)
        self.started = time.monotonic()
        self.connection_ids = itertools.count(1)

    def reap(self) -> None:
        """End idle transactions and cursors (called periodically)."""
        now = time.monotonic()
        self.transactions.reap(now)
        self.cursors.reap(now)

    def close(self) -> None:
        """Roll back transactions, drop cursors, close sessions (shutdown)."""
        self.transactions.close()
        self.cursors.close()
        self.pool.close()


@dataclass(frozen=True)
class Client:
    """One client connection, as commands like hello and whatsmyuri describe it."""

    connection_id: int
    peer: str


@dataclass
class Context:
    """One command in flight: the request, where it runs, and the session it borrowed."""

    state: GatewayState
    client: Client
    request: Request
    txn: Transaction | None = None
    _conn: PgConnection | None = field(default=None, repr=False)

    @property
    def body(self) -> dict[str, Any]:
        """The decoded command document."""
        return self.request.body

    @property
    def db(self) -> str:
        """The command's database."""
        return self.request.db

    @property
    def db_param(self) -> bytes:
        """The database name as a text parameter."""
        return self.request.db.encode()

    def pg(self) -> PgConnection:
        """The session to run on: the transaction's, else one borrowed for this command."""
        if self.txn is not None and self.txn.conn is not None:
            return self.txn.conn
        if self._conn is None:
            self._conn = self.state.pool.acquire()
        return self._conn

    def run(self, stmt: Statement, *params: Value) -> Row:
        """Run a prepared statement on this command's session."""
        return self.pg().run(stmt, params)

    def run_raw(self, stmt: Statement) -> Row:
        """Run `stmt(database, command document)`: the engine gets the body unchanged."""
        return self.pg().run(stmt, (self.db_param, self.request.raw_body))

    def detach(self) -> PgConnection:
        """Keep the borrowed session past this command (a persisted cursor owns it now)."""
        conn = self.pg()
        self._conn = None
        return conn

    def with_lookup_session(self, use: Callable[[PgConnection], Any]) -> Any:
        """Run a metadata lookup on a session that can still run queries.

        A transaction's session is unusable after a statement failed in it, so
        lookups then borrow a separate session.
        """
        conn = self.pg()
        if not conn.failed_transaction:
            return use(conn)
        spare = self.state.pool.acquire()
        try:
            return use(spare)
        finally:
            self.state.pool.release(spare)

    def release(self) -> None:
        """Return the borrowed session to the pool (after the reply is built)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self.state.pool.release(conn)


Handler = Callable[[Context], Reply]
