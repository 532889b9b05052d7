"""Fixtures for HTTP tests: the real app and store, a router the test controls, a fake clock."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import flask
import pytest
from pymongo.database import Database

from eventbus.app import build_service, create_app
from eventbus.config import Settings
from eventbus.idempotency import AfterSuccess
from eventbus.router import Router
from eventbus.store import MongoEventStore


class Clock:
    """A clock the test moves by hand; nothing sleeps."""

    def __init__(self) -> None:
        self.moment = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += dt.timedelta(seconds=seconds)


@dataclasses.dataclass
class Harness:
    """The app under test with the parts a test inspects."""

    client: Any
    store: MongoEventStore
    clock: Clock
    router: Router
    app: flask.Flask

    def push(self, event: dict[str, Any] | bytes, message_id: str = "m-1",
             **attributes: str) -> Any:
        data = event if isinstance(event, bytes) else json.dumps(event).encode()
        body = {"message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                            "attributes": attributes},
                "subscription": "projects/p/subscriptions/s"}
        return self.client.post("/", json=body)


def event(event_type: str = "TEST", **data: Any) -> dict[str, Any]:
    """Return a valid event payload of ``event_type`` with ``data``."""
    return {"event_type": event_type, "event_version": "v1",
            "entity_metadata": {"partnerId": "p1", "partnerName": "Partner One",
                                "entity_id": "e-1", "entity_type": "Order"},
            "entity_data": data}


@pytest.fixture()
def settings(mongo_db: Database, mongo_uri: str) -> Settings:
    # No inline relay by default: tests that relay pass their own ``after_success``.
    return Settings(mongodb_uri=mongo_uri, mongodb_db=mongo_db.name, lease_seconds=30,
                    max_attempts=5, store_timeout_ms=3000, relay_inline=False)


@pytest.fixture()
def make_harness(settings: Settings) -> Iterator[Callable[..., Harness]]:
    stores: list[MongoEventStore] = []

    def make(router: Router | None = None, after_success: AfterSuccess | None = None,
             clock: Clock | None = None, **overrides: Any) -> Harness:
        final = dataclasses.replace(settings, **overrides)
        store = MongoEventStore.from_settings(final)
        stores.append(store)
        clock = clock or Clock()
        service = build_service(final, store, router=router, now=clock,
                                after_success=after_success)
        app = create_app(final, store, service=service)
        return Harness(app.test_client(), store, clock, router or Router(), app)

    yield make
    for store in stores:
        store.collection.database.client.close()
