"""Partner notifications: a two-step cascade that tells the partner, then records it.

A domain handler calls ``notify_partner(context, kind, payload)``, which emits
``PARTNER_NOTIFY`` (an OUT event). Then:

1. ``PARTNER_NOTIFY`` calls the partner endpoint (``EVENTBUS_PARTNER_URL``)
   through ``eventbus.guard``, which makes the call once per event key,
   and emits ``PARTNER_NOTIFY_SENT``; the URL and the ``Idempotency-Key``
   header follow the rules of ``handlers.partners`` and are built inside the
   guarded call;
2. ``PARTNER_NOTIFY_SENT`` records the notification in
   ``partner_notifications``, once.

Each step is its own event, so a partner that is down retries only the call,
and the store shows how far each notification went (``eventbus trace``).
The call goes through the partner's breaker (``context.partner``): while a
partner is down its notifications are parked and acked, and the redrive
brings them back when its breaker lets a probe through.

With ``EVENTBUS_PARTNER_NOTIFY_ASYNC`` on, step 1 is ``AsyncPartnerNotifier``:
an ``async def`` handler awaiting ``AsyncPartnerClient.deliver`` (httpx, the
async guard and breaker), so a worker or an instance has as many partner
calls in flight as ``EVENTBUS_ASYNC_CONCURRENCY`` allows, not one per thread.

The notifier owns its HTTP clients, the library's, built once: the sync one
on the app's session when the routes are built (``eventbus.http.deadline.Client``:
a session that cannot honour the call's deadline is refused then, at
start-up), the async one (``async_client``, for async handlers) on the app's
``httpx.AsyncClient`` when given (checked at start-up too), else on a
logging one made at its first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import requests
from pymongo.errors import DuplicateKeyError

from eventbus import Context, PermanentError, Router
from eventbus.correlation.async_session import logging_client
from eventbus.http import deadline
from eventbus.http.deadline_async import AsyncClient
from handlers.common import CONTENT_ERRORS, require
from handlers.partners import AsyncPartnerClient, PartnerClient, partner_url
from handlers.settings import PartnerSettings

NOTIFY = "PARTNER_NOTIFY"
SENT = "PARTNER_NOTIFY_SENT"
NOTIFICATIONS = "partner_notifications"


def notify_partner(context: Context, kind: str, payload: Mapping[str, Any]) -> str:
    """Emit the event that tells the partner about ``kind``; return its key."""
    return context.emit(NOTIFY, {"kind": kind, "payload": dict(payload)}, direction="OUT")


class PartnerNotifier:
    """The ``PARTNER_NOTIFY`` step, bound to the app's partner settings and HTTP clients."""

    def __init__(self, settings: PartnerSettings, session: requests.Session | None = None,
                 async_http: httpx.AsyncClient | None = None) -> None:
        """Build the clients now: ``session`` or ``async_http`` that cannot be bounded by the
        call's deadline raise ``eventbus.http.deadline.UnboundedSession`` here, at start-up."""
        self.settings = settings
        self.http = deadline.Client(session)
        self._async_http = AsyncClient(async_http) if async_http is not None else None

    def __call__(self, context: Context) -> None:
        """Call the partner once for this event, then emit that it was sent."""
        body = self.body(context)
        delivered = self.client(context).deliver(context.key, lambda: self.url(context), body)
        context.emit(SENT, {"kind": body["kind"], "payload": body["payload"],
                            "notification": context.key, "statusCode": delivered.status_code},
                     direction="OUT")

    def body(self, context: Context) -> dict[str, Any]:
        """Return what the partner is sent for this event (a bad payload is permanent)."""
        kind = require(context.event.entity_data, "kind", str)
        payload = require(context.event.entity_data, "payload", dict)
        meta = context.event.entity_metadata
        return {"kind": kind, "partnerId": meta.partner_id, "entity_id": meta.entity_id,
                "entity_type": meta.entity_type, "payload": payload,
                "idempotencyKey": context.key}

    def client(self, context: Context) -> PartnerClient:
        """Return a partner client on the handler's guard and the partner's breaker."""
        return PartnerClient(context.guard, timeout=self.settings.timeout_seconds,
                             http=self.http,
                             partner=context.partner(context.event.entity_metadata.partner_id))

    def async_client(self) -> AsyncPartnerClient:
        """Return the async partner client (``await client.call(key, url, body)``)."""
        if self._async_http is None:  # made at first use: a sync app never builds it
            self._async_http = AsyncClient(logging_client())
        return AsyncPartnerClient(self._async_http, timeout=self.settings.timeout_seconds)

    def url(self, context: Context) -> str:
        """Return the partner endpoint for this event's partner (``partner_url``)."""
        return partner_url(self.settings.url, context.event.entity_metadata.partner_id)


class AsyncPartnerNotifier(PartnerNotifier):
    """The ``PARTNER_NOTIFY`` step as an ``async def`` handler: the same body, URL, guard key,
    breaker and child, the call awaited on httpx (``AsyncPartnerClient.deliver``)."""

    async def __call__(self, context: Context) -> None:  # type: ignore[override]
        """Call the partner once for this event (awaited), then emit that it was sent."""
        body = self.body(context)
        partner = context.partner(context.event.entity_metadata.partner_id)
        delivered = await self.async_client().deliver(context.guard, context.key,
                                                      lambda: self.url(context), body, partner)
        context.emit(SENT, {"kind": body["kind"], "payload": body["payload"],
                            "notification": context.key, "statusCode": delivered.status_code},
                     direction="OUT")


def on_partner_notify_sent(context: Context) -> None:
    """Record the sent notification once, under the key of the call that sent it."""
    data = context.event.entity_data
    meta = context.event.entity_metadata
    document = {"_id": require(data, "notification", str), "kind": require(data, "kind", str),
                "partnerId": meta.partner_id, "partnerName": meta.partner_name,
                "entity_id": meta.entity_id, "payload": data.get("payload", {}),
                "status": "SENT", "statusCode": data.get("statusCode"),
                "recorded": context.now(), "recordedBy": context.key}
    try:
        context.db[NOTIFICATIONS].insert_one(document)
    except DuplicateKeyError:
        context.log.info("notification %s already recorded", document["_id"])
    except CONTENT_ERRORS as exc:
        raise PermanentError(f"notification cannot be stored: {type(exc).__name__}") from exc


def create_routes(settings: PartnerSettings, session: requests.Session | None = None,
                  async_http: httpx.AsyncClient | None = None) -> Router:
    """Return the two notification steps (internal: only the relay sends them)."""
    routes = Router()
    notifier = AsyncPartnerNotifier if settings.notify_async else PartnerNotifier
    routes.handler(NOTIFY, internal=True)(notifier(settings, session, async_http))
    routes.handler(SENT, internal=True)(on_partner_notify_sent)
    return routes
