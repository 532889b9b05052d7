"""Shared fixtures: a real MongoDB-compatible server for every storage test.

The server is ``MONGODB_URI`` when set; otherwise the local server that
``python -m localdb start`` provides (started here if needed). Under
``CI=true`` a missing server fails the tests that need it; it never skips them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.servers import unavailable


def require_server(what: str, error: BaseException) -> None:
    """Fail under CI, skip elsewhere, when a server the test needs is missing."""
    unavailable(f"{what} is not available: {error}")


def _local_uri() -> str:
    if os.environ.get("MONGODB_URI"):
        return os.environ["MONGODB_URI"]
    from localdb import manager  # imported late: only storage tests need it

    return manager.ensure_started()


@pytest.fixture(scope="session")
def mongo_uri() -> str:
    """The URI of a running MongoDB-compatible server."""
    try:
        uri = _local_uri()
        MongoClient(uri, serverSelectionTimeoutMS=5000).admin.command("ping")
    except Exception as exc:  # any failure means "no server", reported once
        require_server("MongoDB", exc)
    return uri


@pytest.fixture(scope="session")
def mongo_client(mongo_uri: str) -> Iterator[MongoClient]:
    """A client shared by the session, tz-aware like the service's."""
    client: MongoClient = MongoClient(mongo_uri, tz_aware=True, serverSelectionTimeoutMS=5000)
    yield client
    client.close()


@pytest.fixture()
def mongo_db(mongo_client: MongoClient) -> Iterator[Database]:
    """A fresh database per test, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield mongo_client[name]
    mongo_client.drop_database(name)
