"""A bench-only handler module: ``BENCH_PARTNER`` calls its event's partner through its breaker.

The call is the partner app's own (``handlers.partners.PartnerClient``): the
side-effect guard, then the partner's breaker and rate (``context.partner``),
then a POST to ``BENCH_PARTNER_URL`` (a template with ``{partnerId}``) with a
total deadline of ``BENCH_PARTNER_TIMEOUT`` seconds. Load it with
``EVENTBUS_HANDLER_MODULES=bench.partner_handlers``.
"""

from __future__ import annotations

import os

from eventbus import Context, Router, deadline
from handlers.partners import PartnerClient, partner_url

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
