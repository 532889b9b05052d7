"""One message as the push endpoint received it, whatever form it came in."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

_FRACTION = re.compile(r"(\.\d{6})\d+")

FIRST_PUBLISH_TIME = "first_publish_time"
"""The attribute a redriven message carries: the ``publishTime`` of the event's first
message. Pub/Sub stamps each republished message anew, and a route's ``max_age`` counts
from the first (``Delivery.first_published_at``)."""


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

    def published_at(self) -> dt.datetime | None:
        """Pub/Sub's ``publishTime`` (RFC 3339, up to nanoseconds); None when it is not one."""
        return _rfc3339(self.publish_time)

    def first_published_at(self) -> dt.datetime | None:
        """The earlier of ``publishTime`` and a redrive's ``first_publish_time`` attribute.

        The earlier one only: a publisher who sets the attribute can make its own event
        older, never younger, than Pub/Sub says (None when neither is a time).
        """
        return earliest(self.publish_time, self.attributes.get(FIRST_PUBLISH_TIME))


def earliest(*values: object) -> dt.datetime | None:
    """The earliest of ``values`` that are RFC 3339 times; None when none is."""
    times = [moment for moment in map(_rfc3339, values) if moment is not None]
    return min(times) if times else None


def _rfc3339(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value or len(value) > 40:
        return None
    try:
        moment = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", value.replace("Z", "+00:00")))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
