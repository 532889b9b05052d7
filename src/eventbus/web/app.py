"""The Flask application factory, in the style of Flask's tutorial.

``create_app(router, settings)`` wires store, router, clock, publisher,
authenticator and the inline outbox relay into one ``PushService``. The
application owns its router; nothing is global. Tests pass their own
store (``MemoryEventStore``), clock, publisher and ``after_success`` hook.

Telemetry is the service's too: ``eventbus.telemetry.from_settings`` (traces and
metrics off by default), or what the caller passes; the processor and the
inline relay share it, and with ``EVENTBUS_METRICS_EXPORTER=prometheus``
the app serves its metrics at ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flask
from werkzeug.exceptions import HTTPException

from eventbus.assembly import assemble, default_publisher, default_store, inline_relay, utcnow
from eventbus.correlation import logs
from eventbus.model.errors import Classifier
from eventbus.model.router import Router
from eventbus.processor import AfterSuccess, Clock
from eventbus.pubsub.message import MessagePublisher
from eventbus.pubsub.push_auth import Authenticator
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from eventbus.telemetry import Telemetry
from eventbus.web.service import PushRoute, PushService

__all__ = ["build_service", "create_app", "default_publisher", "default_store", "inline_relay",
           "push_target", "utcnow"]

PUSH_PATHS = ("/", "/push")


def build_service(router: Router, settings: Settings, store: EventStore | None = None, *,
                  now: Clock | None = None, publisher: MessagePublisher | None = None,
                  after_success: AfterSuccess | None = None,
                  classifier: Classifier | None = None,
                  telemetry: Telemetry | None = None) -> PushService:
    """Wire one ``PushService`` from its parts (``eventbus.assembly.assemble``) and the auth."""
    parts = assemble(router, settings, store, now=now, publisher=publisher,
                     after_success=after_success, classifier=classifier, telemetry=telemetry)
    authenticator = (Authenticator(settings.auth_audience, settings.auth_service_accounts)
                     if settings.auth_enabled else None)
    return PushService(settings, parts.store, parts.processor, authenticator,
                       telemetry=parts.telemetry)


def create_app(router: Router, settings: Settings | None = None,
               store: EventStore | None = None, *, now: Clock | None = None,
               publisher: MessagePublisher | None = None,
               after_success: AfterSuccess | None = None,
               classifier: Classifier | None = None,
               service: PushService | None = None,
               telemetry: Telemetry | None = None) -> flask.Flask:
    """Return the Flask app serving the push endpoint and health checks for ``router``."""
    settings = settings or Settings.from_env()
    logs.configure(settings.service, settings.log_level, project=settings.project_id)
    service = service or build_service(router, settings, store, now=now, publisher=publisher,
                                       after_success=after_success, classifier=classifier,
                                       telemetry=telemetry)
    service.ensure_indexes()
    app = flask.Flask("eventbus")
    app.extensions["eventbus"] = service
    endpoints = {path: f"push{path}" for path in PUSH_PATHS}
    for path, endpoint in endpoints.items():
        app.add_url_rule(path, view_func=service.view, methods=["POST"], endpoint=endpoint)
    app.add_url_rule("/health", view_func=_health, methods=["GET"])
    app.add_url_rule("/ready", view_func=lambda: _ready(service), methods=["GET"])
    if service.telemetry.metrics_page() is not None:
        app.add_url_rule("/metrics", view_func=lambda: _metrics(service.telemetry),
                         methods=["GET"], endpoint="metrics")
    app.register_error_handler(HTTPException, _http_error)
    # Pushes skip Flask's dispatch while the app adds nothing to a request (``PushRoute``).
    app.wsgi_app = PushRoute(app, service, endpoints, app.wsgi_app)  # type: ignore[method-assign]
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


def _metrics(telemetry: Telemetry) -> flask.Response:
    page, content_type = telemetry.metrics_page() or (b"", "text/plain")
    return flask.Response(page, mimetype=None, content_type=content_type)


def _http_error(error: HTTPException) -> tuple[dict[str, Any], int]:
    status = error.code or 500
    return {"error": (error.name or "error").lower().replace(" ", "_"),
            "message": error.description or ""}, status
