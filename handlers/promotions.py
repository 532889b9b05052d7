"""Promotions (``PROM_MGMT``, entity type ``Prom``): keep the partner's live promotions."""

from __future__ import annotations

from eventbus import Context, PermanentError, Router
from handlers.common import apply_projection, event_time, projection_id, require, require_text

routes = Router()


@routes.handler("PROM_MGMT")
def on_promotion_event(context: Context) -> None:
    """Project a promotion; a discount outside 0-100 % can never be applied."""
    data = context.event.entity_data
    promotion_id = require_text(require(data, "promotionId", str), "entity_data.promotionId")
    discount = require(data, "discountPercent", (int, float))
    if not 0 < discount <= 100:
        raise PermanentError(f"discountPercent {discount} is outside (0, 100]")
    as_of = event_time(context, data, "updatedAt")
    partner = require_text(context.event.entity_metadata.partner_id, "partnerId")
    state = {"promotionId": promotion_id, "partnerId": partner, "code": data.get("code", ""),
             "discountPercent": discount, "validFrom": data.get("validFrom"),
             "validTo": data.get("validTo"), "active": bool(data.get("active", True))}
    apply_projection(context, "promotion_projection", projection_id(partner, promotion_id),
                     as_of, state)
