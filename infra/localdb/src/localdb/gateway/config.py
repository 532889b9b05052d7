"""The gateway's settings, with the defaults of docs/ARCHITECTURE.md ("Local servers")."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 27018
DEFAULT_DSN = "host=127.0.0.1 port=5433 user=postgres dbname=postgres"


@dataclass(frozen=True)
class GatewayConfig:
    """Where to listen, which PostgreSQL to use, and the limits that protect both."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0 picks a free port; the log says which
    dsn: str = DEFAULT_DSN
    # PostgreSQL allows 100 sessions by default and other tools share it.
    pool_size: int = 16
    acquire_timeout_s: float = 30.0
    max_message_bytes: int = 48_000_000
    # Inside a transaction a row lock held elsewhere is a write conflict (the
    # driver retries the transaction), as in MongoDB, not a long wait.
    txn_lock_timeout_ms: int = 20
    txn_lifetime_s: float = 60.0  # MongoDB's transactionLifetimeLimitSeconds
    cursor_timeout_s: float = 600.0  # MongoDB's cursorTimeoutMillis
    # Cursors whose state lives in a PostgreSQL session (sorted finds, most
    # aggregations) keep that session; past this many, new ones are read
    # to the end into memory instead.
    max_pinned_cursors: int = 16
    reap_interval_s: float = 5.0


def parse_listen(value: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError with the reason."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen wants HOST:PORT, got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or DEFAULT_HOST, int(port)
