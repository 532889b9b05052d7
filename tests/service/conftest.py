"""Fixtures for the service tests: the real Flask app on the in-memory store, no server.

The harness posts to the Flask app, or (``entry`` ``asgi``) to ``asgi_app`` over it.

The app is ``eventbus.create_app`` with a ``MemoryEventStore``, a fake clock
and, when a test relays, a capturing publisher. Handlers that keep
projections or notifications write to a ``mongomock`` database.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import flask
import mongomock
import pytest
from pymongo.database import Database

from eventbus import asgi_app, create_app
from eventbus.model.router import Router
from eventbus.processor import AfterSuccess
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from handlers import create_router
from handlers.settings import AppSettings, PartnerSettings
from tests.asgi_client import AsgiClient

START = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
# Nothing listens here: the app's default router for tests that make no partner call.
NO_PARTNER = "http://127.0.0.1:9/partners/{partnerId}/events"


@dataclasses.dataclass
class Harness:
    """The app under test with the parts a test inspects."""

    client: Any
    store: MemoryEventStore
    clock: FakeClock
    router: Router
    app: flask.Flask
    db: Database
    """The handlers' own database (mongomock): projections and notifications."""

    def push(self, event: dict[str, Any] | bytes, message_id: str = "m-1",
             **attributes: str) -> Any:
        return self.client.post("/", json=wrapped(event, message_id, **attributes))


def wrapped(event: dict[str, Any] | bytes, message_id: str = "m-1",
            **attributes: str) -> dict[str, Any]:
    """The wrapped push body Pub/Sub sends for ``event`` (a payload, or its raw bytes)."""
    data = event if isinstance(event, bytes) else json.dumps(event).encode()
    return {"message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                        "attributes": attributes},
            "subscription": "projects/p/subscriptions/s"}


def event(event_type: str = "TEST", **data: Any) -> dict[str, Any]:
    """Return a valid event payload of ``event_type`` with ``data``."""
    return {"event_type": event_type, "event_version": "v1",
            "entity_metadata": {"partnerId": "p1", "partnerName": "Partner One",
                                "entity_id": "e-1", "entity_type": "Order"},
            "entity_data": data}


def app_router(partner_url: str = NO_PARTNER, notify_async: bool = False) -> Router:
    """Return the partner app's own router, calling partners at ``partner_url`` (with the
    ``async def`` notifier when ``notify_async``)."""
    return create_router(AppSettings(partners=PartnerSettings(url=partner_url,
                                                              notify_async=notify_async)))


def memory_database() -> Database:
    """Return a fresh mongomock database, tz-aware like the service's client."""
    database: Database = mongomock.MongoClient(tz_aware=True)["svc"]
    return database


@pytest.fixture()
def settings() -> Settings:
    # No inline relay by default: tests that relay pass their own ``after_success``.
    return Settings(lease_seconds=30, max_attempts=5, relay_inline=False)


Make = Callable[..., Harness]


@pytest.fixture()
def entry() -> str:
    """Which push entry the harness's client posts to: ``wsgi`` (Flask's test client on
    ``create_app``) here; modules of hostile input override it with both (``ENTRIES``)."""
    return "wsgi"


ENTRIES = ("wsgi", "asgi")
"""``wsgi``: the Flask app (gunicorn's ``main:app``); ``asgi``: ``asgi_app`` over it (uvicorn's)."""


@pytest.fixture()
def notify_async() -> bool:
    """Whether the app's router calls partners from its ``async def`` notifier (modules that
    test the partner call override it with both)."""
    return False


@pytest.fixture()
def make_harness(settings: Settings, entry: str, notify_async: bool,
                 request: pytest.FixtureRequest) -> Make:
    def make(router: Router | None = None, after_success: AfterSuccess | None = None,
             clock: FakeClock | None = None, publisher: MessagePublisher | None = None,
             partner_url: str = NO_PARTNER, store: MemoryEventStore | None = None,
             **overrides: Any) -> Harness:
        """Return a harness; ``router=None`` is the app's own router (``handlers``)."""
        final = settings.replace(**overrides)
        db = store.database if store is not None and store.database is not None \
            else memory_database()
        clock = clock or FakeClock(START)
        if store is None:  # on the harness's clock: the store's clock is the one tests move
            store = MemoryEventStore(lease=dt.timedelta(seconds=final.lease_seconds),
                                     created_by=final.service, database=db, clock=clock)
        router = router if router is not None else app_router(partner_url, notify_async)
        app = create_app(router, final, store, now=clock, after_success=after_success,
                         publisher=publisher)
        # The processor's event loop (async handlers) ends with the test.
        request.addfinalizer(lambda: app.extensions["eventbus"].processor.close(grace=0))
        client: Any = app.test_client()
        if entry == "asgi":
            client = AsgiClient(asgi_app(app))
            request.addfinalizer(client.close)
        return Harness(client, store, clock, router, app, db)

    return make
