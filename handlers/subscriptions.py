"""Subscriptions (``SUB_MGMT``, entity type ``Sub``): projection and partner notification."""

from __future__ import annotations

from eventbus import Context, PermanentError, Router
from handlers.common import (
    apply_projection,
    event_time,
    projection_id,
    require,
    require_text,
)
from handlers.notifications import notify_partner

SUBSCRIPTION_STATUSES = ("ACTIVE", "PAUSED", "CANCELLED")

routes = Router()


@routes.handler("SUB_MGMT")
def on_subscription_event(context: Context) -> None:
    """Project the subscription's state; tell the partner when one is cancelled."""
    data = context.event.entity_data
    subscription_id = require_text(require(data, "subscriptionId", str),
                                   "entity_data.subscriptionId")
    status = require(data, "status", str)
    if status not in SUBSCRIPTION_STATUSES:
        raise PermanentError(f"unknown subscription status {status!r}")
    as_of = event_time(context, data, "updatedAt")
    partner = require_text(context.event.entity_metadata.partner_id, "partnerId")
    state = {"subscriptionId": subscription_id, "partnerId": partner, "status": status,
             "plan": data.get("plan", ""), "renewsAt": data.get("renewsAt")}
    doc_id = projection_id(partner, subscription_id)
    if apply_projection(context, "subscription_projection", doc_id, as_of, state) \
            and status == "CANCELLED":
        notify_partner(context, "subscription-cancelled",
                       {"subscriptionId": subscription_id, "asOf": as_of})
