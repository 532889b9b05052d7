"""A bench-only handler module: ``BENCH_PARTNER`` calls its event's partner through its breaker.

The call is the partner app's own (``handlers.partners.PartnerClient``): the
side-effect guard, then the partner's breaker and rate (``context.partner``),
then a POST to ``BENCH_PARTNER_URL`` (a template with ``{partnerId}``) with a
total deadline of ``BENCH_PARTNER_TIMEOUT`` seconds; ``BENCH_PARTNER_ASYNC`` is the
same call from an ``async def`` handler (``AsyncPartnerClient.deliver``: httpx, the
async guard and breaker). Load it with
``EVENTBUS_HANDLER_MODULES=bench.partner_handlers``.
"""

from __future__ import annotations

import os

import httpx

from eventbus import Context, Router
from eventbus.http import deadline
from eventbus.http.deadline_async import AsyncClient
from handlers.partners import AsyncPartnerClient, PartnerClient, partner_url

EVENT_TYPE = "BENCH_PARTNER"

routes = Router()
_SESSION = deadline.session()  # one pool per process, as the app's notifier keeps one


@routes.handler(EVENT_TYPE)
def call_partner(context: Context) -> None:
    """POST the event to its partner once, through the guard and the partner's breaker."""
    partner = context.event.entity_metadata.partner_id
    client = PartnerClient(context.guard, session=_SESSION, partner=context.partner(partner),
                           timeout=float(os.environ.get("BENCH_PARTNER_TIMEOUT", "1.0")))
    url = partner_url(os.environ.get("BENCH_PARTNER_URL", "http://127.0.0.1:9/{partnerId}"),
                      partner)
    client.deliver(context.key, url, {"n": context.event.entity_data.get("n")})


ASYNC_EVENT_TYPE = "BENCH_PARTNER_ASYNC"
_ASYNC_HTTP: list[AsyncClient] = []  # one pool, made on the processor's loop at first use


@routes.handler(ASYNC_EVENT_TYPE)
async def call_partner_async(context: Context) -> None:
    """``call_partner`` as ``async def``: the same guard, breaker and POST, awaited on httpx."""
    if not _ASYNC_HTTP:
        # No kept-alive connections: httpcore 1.0's pool assigns requests in O(N^2) over its
        # connections (encode/httpcore#1035, open), which at 100 in flight costs more CPU than
        # a local connect (measured: 100 calls 0.5 s and 2 ms CPU each, against 2 to 5 s and
        # up to 30 ms each with 100 kept alive).
        _ASYNC_HTTP.append(AsyncClient(httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))))
    partner = context.event.entity_metadata.partner_id
    client = AsyncPartnerClient(_ASYNC_HTTP[0],
                                timeout=float(os.environ.get("BENCH_PARTNER_TIMEOUT", "1.0")))
    url = partner_url(os.environ.get("BENCH_PARTNER_URL", "http://127.0.0.1:9/{partnerId}"),
                      partner)
    await client.deliver(context.guard, context.key, url, {"n": context.event.entity_data.get("n")},
                         context.partner(partner))
