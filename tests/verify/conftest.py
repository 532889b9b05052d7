"""Fixtures of the verify tests that need the server: a ``MongoEventStore`` on the test's
database (under ``CI=true`` a missing server fails, never skips: ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pymongo.database import Database

from eventbus.settings import Settings
from eventbus.store.mongo import MongoEventStore


@pytest.fixture()
def store(mongo_uri: str, mongo_db: Database) -> Iterator[MongoEventStore]:
    """The store on the test's own database, indexes ensured; closed after the test."""
    found = MongoEventStore.from_settings(Settings(mongodb_uri=mongo_uri,
                                                  mongodb_db=mongo_db.name))
    found.ensure_indexes()
    yield found
    found.close()
