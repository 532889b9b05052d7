"""Readiness checks: a pymongo `ping` and a PostgreSQL query, each with a short timeout."""

from __future__ import annotations

from typing import Any

import psycopg
from pymongo import MongoClient
from pymongo.errors import PyMongoError


def mongo_ping(uri: str, timeout: float = 2.0) -> str | None:
    """None when `ping` succeeds at `uri`, else the reason it did not."""
    ms = int(timeout * 1000)
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
    )
    try:
        client.admin.command("ping")
        return None
    except PyMongoError as exc:
        return _short(str(exc))
    finally:
        client.close()


def pg_query(dsn: str, sql: str, timeout: float = 5.0) -> list[tuple[Any, ...]]:
    """Run one statement with connect and statement timeouts; its rows (empty if none).

    Raises psycopg.Error, which callers turn into one-line messages.
    """
    options = f"-c statement_timeout={int(timeout * 1000)}"
    with psycopg.connect(dsn, connect_timeout=max(1, int(timeout)), options=options,
                         autocommit=True) as conn:
        cur = conn.execute(sql.encode())
        return cur.fetchall() if cur.description else []


def pg_error(dsn: str) -> str | None:
    """None when PostgreSQL at `dsn` answers a query, else the reason it did not."""
    try:
        pg_query(dsn, "SELECT 1", timeout=2.0)
        return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _short(message: str) -> str:
    """A pymongo error without the timeout settings and topology dump it appends."""
    for noise in (" (configured timeouts", ", Timeout:"):
        message = message.split(noise)[0]
    return message
