"""The service's handlers, on a router of its own.

* ``ORDER_PLACED`` checks the order and emits a ``RECEIPT_SEND`` child;
* ``RECEIPT_SEND`` sends the receipt through ``context.guard``, so a retried
  or redelivered event never sends it twice.

The sender is injected: a real service passes an e-mail client, tests a list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eventbus import Context, PermanentError, Router

ORDER_PLACED = "ORDER_PLACED"
RECEIPT_SEND = "RECEIPT_SEND"
Sender = Callable[[Mapping[str, Any]], str]


def create_router(send: Sender) -> Router:
    """Return the service's router, with receipts going to ``send``."""
    routes = Router()

    @routes.handler(ORDER_PLACED)
    def on_order_placed(context: Context) -> None:
        """Check the order; emit the receipt to send."""
        data = context.event.entity_data
        total = data.get("total")
        if not isinstance(total, int | float) or isinstance(total, bool) or total <= 0:
            raise PermanentError(f"order total must be a positive number, got {total!r}")
        context.emit(RECEIPT_SEND, {"email": data.get("email", ""), "total": total})

    @routes.handler(RECEIPT_SEND)
    def on_receipt_send(context: Context) -> None:
        """Send the receipt at most once per event key."""
        receipt = dict(context.event.entity_data)
        context.guard.run(context.key, lambda: {"message_id": send(receipt)})

    return routes
