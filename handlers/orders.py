"""Order management (``OR_MGMT``): keep an order projection, notify the partner.

A status the partner wants to hear about starts the notification cascade
(``handlers/notifications.py``): the handler only emits ``PARTNER_NOTIFY``;
the partner call and its record are later steps, each retried on its own.

Version 2 is current: ``orderId``, ``orderStatusLatest``,
``orderStatusLatestTimestamp`` (epoch seconds), ``orderLineItems`` and
``orderSummary``. Version 1 events (``status``, ``timestamp``, ``items``)
are upcast to version 2 before the handler sees them.

The handler is ordered by ``orderStatusLatestTimestamp`` (``ordered_by``): the
framework runs it only for an order's newest event, one at a time, and stores
an older one that comes late as stale (the sync guide's A retried after B
and C never overwrites C). The timestamp must still be plausible epoch
seconds and the order id a 64-bit integer or short text (``handlers.common``);
the projection's id cannot collide across partners (``projection_id``).
"""

from __future__ import annotations

from eventbus import Context, PermanentError, Router
from eventbus.model.event import Event
from handlers.common import (
    event_time,
    projection_id,
    require,
    require_id,
    require_text,
    store_projection,
)
from handlers.notifications import notify_partner

ORDER_STATUSES = {"OR_PLC": "placed", "OR_CNF": "confirmed", "OR_SHP": "shipped",
                  "OR_DLV": "delivered", "OR_CNL": "cancelled"}
# The partner wants to hear about these transitions.
NOTIFY_ON = {"OR_CNF", "OR_SHP", "OR_CNL"}

routes = Router()


def order_v1_to_v2(event: Event) -> Event:
    """Rename the v1 fields to their v2 names."""
    old = event.entity_data
    data = {"orderId": old.get("orderId"), "orderStatusLatest": old.get("status"),
            "orderStatusLatestTimestamp": old.get("timestamp"),
            "orderLineItems": old.get("items", []), "orderSummary": old.get("summary", {})}
    return event.with_version("v2", data)


@routes.handler("OR_MGMT", versions=("v2",), upcasters={"v1": order_v1_to_v2},
                ordered_by="entity_data.orderStatusLatestTimestamp")
def on_order_event(context: Context) -> None:
    """Project the order's latest status; notify the partner of the transitions it wants."""
    data = context.event.entity_data
    order_id = require_id(data, "orderId")
    status = require(data, "orderStatusLatest", str)
    if status not in ORDER_STATUSES:
        raise PermanentError(f"unknown order status {status!r}")
    as_of = event_time(context, data, "orderStatusLatestTimestamp")
    partner = require_text(context.event.entity_metadata.partner_id, "partnerId")
    state = {"orderId": order_id, "partnerId": partner, "status": status,
             "statusName": ORDER_STATUSES[status], "lineItems": data.get("orderLineItems", []),
             "summary": data.get("orderSummary", {})}
    store_projection(context, "order_projection", projection_id(partner, order_id), as_of, state)
    if status in NOTIFY_ON:
        notify_partner(context, "order-status",
                       {"orderId": order_id, "status": status, "asOf": as_of})
