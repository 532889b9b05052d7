"""Fixtures of the model tests: a factory of fresh worlds' stores, memory and MongoDB.

``make_backend`` is parametrized over ``memory`` (no server) and ``mongo``
(the server of ``tests/conftest.py``, one database per test, emptied for
each world; under ``CI=true`` a missing server fails, never skips).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.model.world import Backend, MemoryBackend, MongoBackend


@pytest.fixture(params=["memory", "mongo"])
def make_backend(request: pytest.FixtureRequest) -> Callable[[], Backend]:
    """Each store in turn: call it for a fresh, empty store of a new world."""
    if request.param == "memory":
        return MemoryBackend
    # Asked for here, not in the signature: the memory half needs no server.
    client = request.getfixturevalue("mongo_client")
    name = request.getfixturevalue("mongo_db").name
    MongoBackend(client, name).store.ensure_indexes()
    return lambda: MongoBackend(client, name)
