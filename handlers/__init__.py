"""The partner app: business handlers, partner calls, settings and the demo.

Each domain module fills a ``Router`` of its own (``routes``); ``public``
declares what is forwarded to public topics; ``create_router`` includes them
into the one router the app gives to ``eventbus.create_app``.
A handler is a function of one ``Context``:

* return normally → the event is stored SUCCESS and acked;
* raise ``PermanentError`` → stored FAILED for good and acked;
* raise anything else → stored FAILED, retryable; Pub/Sub redelivers later.

Write effects so that running them twice is harmless (the framework makes a
second run rare, not impossible: a lease can expire under a slow handler).
"""

from __future__ import annotations

import importlib

import httpx
import requests

from eventbus import Router
from eventbus.correlation.session import logging_session
from handlers import notifications, orders, promotions, public, subscriptions
from handlers.settings import AppSettings

__all__ = ["AppSettings", "create_router"]


def create_router(settings: AppSettings | None = None,
                  session: requests.Session | None = None,
                  async_http: httpx.AsyncClient | None = None) -> Router:
    """Return the app's router: every domain's routes, plus ``EVENTBUS_HANDLER_MODULES``.

    Without ``settings``, they are read from the environment (``eventbus worker``
    calls it so: ``--app handlers:create_router``).

    Partner calls go through ``session`` (default a new one) with every adapter
    wrapped to write one ``REQUEST_OUTBOUND`` line per call; the library's
    client takes it over (``eventbus.http.deadline.Client``), so the call's total
    deadline and answer cap hold whatever adapters it has, or it is refused
    here. Async partner calls go through ``async_http`` (default a logging
    ``httpx.AsyncClient``), under the same rules.
    """
    settings = settings or AppSettings.from_env()
    partners = logging_session(session)
    router = Router().include(orders.routes, subscriptions.routes, promotions.routes,
                              notifications.create_routes(settings.partners, partners,
                                                          async_http),
                              public.routes)
    for name in settings.partners.extra_modules:
        router.include(importlib.import_module(name).routes)
    return router
