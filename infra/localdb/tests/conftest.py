"""Fixtures for the gateway tests: a gateway subprocess on a free port, in front of
PostgreSQL + DocumentDB at LOCALDB_PG_DSN (default: the local server on
LOCALDB_PG_PORT, 5433).

When that PostgreSQL does not answer, tests that need it are skipped, or fail
under CI=true (a missing server must never pass silently in CI). Start it with
`python -m localdb start`. Helpers live in localdb_support.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pymongo import MongoClient
from pymongo.database import Database

from localdb_support import DEFAULT_DSN, GatewayProcess, require, start_gateway


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of a PostgreSQL with the DocumentDB extension, checked once."""
    dsn = os.environ.get("LOCALDB_PG_DSN", DEFAULT_DSN)
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_extension WHERE extname = 'documentdb'").fetchone()
    except psycopg.Error as exc:
        require(f"PostgreSQL at {dsn!r}", exc)
    if not found:
        require(f"PostgreSQL at {dsn!r}", "the documentdb extension is not installed")
    return dsn


@pytest.fixture(scope="session")
def gateway(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway subprocess shared by the session."""
    process = start_gateway(pg_dsn, tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield process
    status = process.stop()
    assert status == 0, f"gateway exited with {status}:\n{process.log()}"


@pytest.fixture(scope="session")
def gw_client(gateway: GatewayProcess) -> Iterator[MongoClient]:
    """A pymongo client of the shared gateway."""
    client = gateway.client()
    try:
        client.admin.command("ping")
    except Exception as exc:  # any failure here means the gateway is unusable
        require("the gateway", f"{exc}\n{gateway.log()}")
    yield client
    client.close()


@pytest.fixture()
def gw_db(gw_client: MongoClient) -> Iterator[Database]:
    """A fresh database per test, dropped afterwards."""
    name = f"gwtest_{uuid.uuid4().hex[:10]}"
    yield gw_client[name]
    gw_client.drop_database(name)
