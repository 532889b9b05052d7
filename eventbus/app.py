"""The Flask application factory, in the style of Flask's tutorial.

``create_app(settings=None, store=None)`` reads the environment once, imports
the handler modules, and wires store, router, clock, authenticator and the
inline outbox relay into one ``PushService``. Tests pass their own settings,
store, clock and ``after_success`` hook (a relay on a fake publisher).
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable
from typing import Any

import flask
from werkzeug.exceptions import HTTPException

from eventbus import logs
from eventbus.auth import Authenticator
from eventbus.config import Settings
from eventbus.idempotency import AfterSuccess, Clock, Processor
from eventbus.publisher import LazyPublisher, Publisher
from eventbus.relay import Relay
from eventbus.router import Router
from eventbus.router import router as default_router
from eventbus.service import PushService
from eventbus.store import MongoEventStore

PUSH_PATHS = ("/", "/push")


def utcnow() -> dt.datetime:
    """Return the current UTC time, timezone-aware: the default clock."""
    return dt.datetime.now(dt.UTC)


def load_handlers(modules: tuple[str, ...]) -> None:
    """Import each handler module so its decorators fill the router."""
    for name in modules:
        importlib.import_module(name)


def build_service(settings: Settings, store: MongoEventStore | None = None, *,
                  router: Router | None = None, now: Clock | None = None,
                  after_success: AfterSuccess | None = None) -> PushService:
    """Wire one ``PushService`` from its parts; missing parts come from ``settings``.

    ``after_success`` runs after each SUCCESS with children; when it is not
    given, it is the inline relay, unless ``settings.relay_inline`` is off.
    """
    load_handlers(settings.handler_modules)
    store = store or MongoEventStore.from_settings(settings)
    now = now or utcnow
    if after_success is None and settings.relay_inline:
        after_success = inline_relay(settings, store, now)
    processor = Processor(store, router or default_router, settings, now,
                          after_success=after_success)
    authenticator = (Authenticator(settings.auth_audience, settings.auth_service_accounts)
                     if settings.auth_enabled else None)
    return PushService(settings, store, processor, authenticator)


def inline_relay(settings: Settings, store: MongoEventStore, now: Clock) -> Relay:
    """Return the relay that publishes a parent's children before its push is acked.

    It spends at most ``settings.relay_budget_seconds`` per message; the
    publisher is built on first use, so a service without Pub/Sub credentials
    still starts (its children wait for the sweeper).
    """
    publisher = LazyPublisher(lambda: Publisher.from_settings(settings))
    return Relay(store.collection, publisher, now=now, budget=settings.relay_budget_seconds)


def create_app(settings: Settings | None = None, store: MongoEventStore | None = None, *,
               router: Router | None = None, now: Clock | None = None,
               after_success: AfterSuccess | None = None,
               service: PushService | None = None) -> flask.Flask:
    """Return the Flask app serving the push endpoint and health checks."""
    settings = settings or Settings.from_env()
    logs.configure(settings.service, settings.log_level)
    service = service or build_service(settings, store, router=router, now=now,
                                       after_success=after_success)
    service.ensure_indexes()
    app = flask.Flask("eventbus")
    app.extensions["eventbus"] = service
    for path in PUSH_PATHS:
        app.add_url_rule(path, view_func=lambda: service.handle(flask.request),
                         methods=["POST"], endpoint=f"push{path}")
    app.add_url_rule("/health", view_func=_health, methods=["GET"])
    app.add_url_rule("/ready", view_func=lambda: _ready(service), methods=["GET"])
    app.register_error_handler(HTTPException, _http_error)
    return app


def push_target(app: flask.Flask) -> Callable[[flask.Request], flask.Response]:
    """Return a functions-framework HTTP target that behaves like ``app``'s push route."""
    service: PushService = app.extensions["eventbus"]

    def pubsub_push(request: flask.Request) -> flask.Response:
        """Handle one Pub/Sub push (wrapped, unwrapped or CloudEvent)."""
        return service.handle(request)

    return pubsub_push


def _health() -> tuple[dict[str, Any], int]:
    return {"status": "ok"}, 200


def _ready(service: PushService) -> tuple[dict[str, Any], int]:
    ready = service.ensure_indexes()
    return {"status": "ok" if ready else "store unavailable"}, 200 if ready else 503


def _http_error(error: HTTPException) -> tuple[dict[str, Any], int]:
    status = error.code or 500
    return {"error": (error.name or "error").lower().replace(" ", "_"),
            "message": error.description or ""}, status
