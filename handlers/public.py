"""What the partner app makes public: order status changes, for a fulfilment service.

The fulfilment service must not subscribe to the event bus (it would come to
depend on ``OR_MGMT``'s internal shape and on every internal step). It reads
the public topic ``order-status``, whose contract is versioned and checked
(``docs/contracts/``, ``eventbus contracts check``):

* ``v1``: order id, partner, status code, when it changed;
* ``v2``: adds the status's name and the number of line items, optional, so
  ``v1`` readers are unaffected. Both are forwarded while consumers move; a
  consumer's subscription filters on ``attributes.contract_version``.

Only confirmed, shipped, delivered and cancelled orders go out: a placed order
is not the fulfilment service's business yet.
"""

from __future__ import annotations

import dataclasses

from eventbus import Router, contract, path
from eventbus.model.forward import Path

TOPIC = "order-status"
FORWARDED_STATUSES = ("OR_CNF", "OR_SHP", "OR_DLV", "OR_CNL")
STATUS_NAMES = {"OR_PLC": "placed", "OR_CNF": "confirmed", "OR_SHP": "shipped",
                "OR_DLV": "delivered", "OR_CNL": "cancelled"}


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@contract(TOPIC, "v1")
@dataclasses.dataclass(frozen=True)
class OrderStatusV1:
    """An order's status changed."""

    order_id: str = dataclasses.field(metadata=_doc("the partner's order id, as text"))
    partner_id: str = dataclasses.field(metadata=_doc("the partner the order belongs to"))
    status: str = dataclasses.field(metadata=_doc("OR_CNF, OR_SHP, OR_DLV or OR_CNL"))
    changed_at: int = dataclasses.field(metadata=_doc("when it changed, epoch seconds"))


@contract(TOPIC, "v2")
@dataclasses.dataclass(frozen=True)
class OrderStatusV2(OrderStatusV1):
    """An order's status changed; v1 plus the status's name and the number of line items."""

    # Additive: v1's fields (inherited, in v1's order), then optional ones only.
    status_name: str | None = dataclasses.field(
        default=None, metadata=_doc("confirmed, shipped, delivered or cancelled"))
    line_items: int | None = dataclasses.field(
        default=None, metadata=_doc("how many line items the order has"))


def _count(items: object) -> int:
    if not isinstance(items, list):
        raise ValueError("orderLineItems is not a list")
    return len(items)


V1_FIELDS: dict[str, str | Path] = {"order_id": path("entity_data.orderId", str),
             "partner_id": "entity_metadata.partnerId",
             "status": "entity_data.orderStatusLatest",
             "changed_at": "entity_data.orderStatusLatestTimestamp"}
WHEN = {"entity_data.orderStatusLatest": FORWARDED_STATUSES}

routes = Router()
routes.forward("OR_MGMT", topic=TOPIC, contract=OrderStatusV1, fields=V1_FIELDS, when=WHEN)
routes.forward("OR_MGMT", topic=TOPIC, contract=OrderStatusV2, when=WHEN, fields={
    **V1_FIELDS, "status_name": path("entity_data.orderStatusLatest", STATUS_NAMES.get),
    "line_items": path("entity_data.orderLineItems", _count)})
