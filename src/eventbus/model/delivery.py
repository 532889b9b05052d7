"""One message as the push endpoint received it, whatever form it came in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One Pub/Sub message: data, attributes and the broker's metadata.

    ``decode_error`` is set when the message is a real delivery whose data
    could not even be decoded; it is then stored FAILED and acked.
    """

    data: bytes
    attributes: Mapping[str, str]
    message_id: str = ""
    publish_time: str = ""
    subscription: str = ""
    delivery_attempt: int | None = None
    ordering_key: str = ""
    form: str = "wrapped"
    decode_error: str | None = None

    def pubsub_document(self) -> dict[str, Any]:
        """Return the Pub/Sub metadata as stored under ``pubsub`` in the event document."""
        return {"messageId": self.message_id, "publishTime": self.publish_time,
                "subscription": self.subscription, "deliveryAttempt": self.delivery_attempt,
                "orderingKey": self.ordering_key, "form": self.form,
                "attributes": dict(self.attributes)}
