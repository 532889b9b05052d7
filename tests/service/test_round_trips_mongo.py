"""The MongoDB round-trip budget of the push path: 2 for a new event, ordered or not.

A duplicate costs 1 (an ordered handler's: 2).

This is the one service test that needs the real server (``mongo_uri`` from the
root conftest; under ``CI=true`` a missing server fails it). It counts the
commands through the store's own ``round_trips`` counter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pymongo.database import Database

from eventbus import create_app
from eventbus.model.context import Context
from eventbus.model.router import Router
from eventbus.settings import Settings
from eventbus.store.mongo import MongoEventStore
from eventbus.testing import FakeClock, push_body
from tests.closing import app_closed_after_test
from tests.service.conftest import START, event


@pytest.fixture()
def store(mongo_uri: str, mongo_db: Database) -> Iterator[MongoEventStore]:
    settings = Settings(mongodb_uri=mongo_uri, mongodb_db=mongo_db.name, lease_seconds=30,
                        max_attempts=5, store_timeout_ms=3000, relay_inline=False)
    events = MongoEventStore.from_settings(settings, count_round_trips=True)
    yield events
    events.close()


def test_round_trips_new_event_two_duplicate_one(store: MongoEventStore) -> None:
    router = Router()

    @router.handler("TEST")
    def handle(context: Context) -> None:
        pass

    settings = Settings(relay_inline=False)
    client = app_closed_after_test(create_app(router, settings, store,
                                              now=FakeClock(START))).test_client()

    def push(key: str, message_id: str) -> str:
        data = json.dumps(event()).encode()
        body = push_body(data, {"idempotency_key": key}, message_id)
        return str(client.post("/", json=body).json["outcome"])

    push("warm", "warm-up")  # indexes and connection pool
    with store.round_trips.measure() as new:
        assert push("rt-1", "m-1") == "processed"
    with store.round_trips.measure() as duplicate:
        assert push("rt-1", "m-2") == "duplicate"
    assert (new.count, duplicate.count) == (2, 1), (new.commands, duplicate.commands)


def test_an_ordered_handler_costs_no_round_trip_more(store: MongoEventStore) -> None:
    # A new event's claim and its entity's hold are one command; the entity's
    # release rides in the finish's. A stale event's entity is taken the full
    # way (one more); a duplicate's claim is tried as a new event first (one more).
    router = Router()
    router.handler("TEST", ordered_by="entity_data.n")(lambda context: None)
    client = app_closed_after_test(create_app(router, Settings(relay_inline=False), store,
                                              now=FakeClock(START))).test_client()

    def push(key: str, n: int) -> str:
        data = json.dumps(event(n=n)).encode()
        body = push_body(data, {"idempotency_key": key}, f"m-{key}")
        return str(client.post("/", json=body).json["outcome"])

    push("warm", 0)
    with store.round_trips.measure() as new:
        assert push("o-2", 2) == "processed"
    with store.round_trips.measure() as newer:
        assert push("o-3", 3) == "processed"
    with store.round_trips.measure() as stale:
        assert push("o-1", 1) == "stale"
    with store.round_trips.measure() as duplicate:
        assert push("o-2", 2) == "duplicate"
    assert (new.count, newer.count, stale.count, duplicate.count) == (2, 2, 3, 2), \
        (new.commands, newer.commands, stale.commands, duplicate.commands)
