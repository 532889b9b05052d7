"""Subscriptions (``SUB_MGMT``, entity type ``Sub``): projection and partner notification."""

from __future__ import annotations

from eventbus import Context, PermanentError, Router
from handlers.common import apply_projection, require
from handlers.notifications import notify_partner

SUBSCRIPTION_STATUSES = ("ACTIVE", "PAUSED", "CANCELLED")

routes = Router()


@routes.handler("SUB_MGMT")
def on_subscription_event(context: Context) -> None:
    """Project the subscription's state; tell the partner when one is cancelled."""
    data = context.event.entity_data
    subscription_id = require(data, "subscriptionId", str)
    status = require(data, "status", str)
    if status not in SUBSCRIPTION_STATUSES:
        raise PermanentError(f"unknown subscription status {status!r}")
    as_of = require(data, "updatedAt", (int, float))
    partner = context.event.entity_metadata.partner_id
    state = {"subscriptionId": subscription_id, "partnerId": partner, "status": status,
             "plan": data.get("plan", ""), "renewsAt": data.get("renewsAt")}
    doc_id = f"{partner}:{subscription_id}"
    if apply_projection(context, "subscription_projection", doc_id, as_of, state) \
            and status == "CANCELLED":
        notify_partner(context, "subscription-cancelled",
                       {"subscriptionId": subscription_id, "asOf": as_of})
