"""The standard message of the bus, built without any Google client.

JSON body (seed 002's event shape) and the attributes ``event_type``,
``event_version`` and ``idempotency_key`` (plus ``parent_key``/``root_key``
for children). Validated with the receiver's own rules, so an event the
service would reject never leaves a publisher. The publisher, the relay,
the CLI and the test bus all build messages here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from eventbus.model.errors import InvalidEvent
from eventbus.model.event import EntityMetadata, Event, event_from_document
from eventbus.model.keys import canonical_json, message_key
from eventbus.settings_base import PUBSUB_MAX_DATA_BYTES

Entity = EntityMetadata | Mapping[str, str]
# Pub/Sub's own cap; the publisher adds three attributes, the relay two more.
MAX_ATTRIBUTES = 100


class MessagePublisher(Protocol):
    """What the relay and the operator commands need from a publisher; tests pass a fake."""

    def publish_message(self, data: bytes, attributes: Mapping[str, str], *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        """Publish one message as it is; return its message id or raise ``PublishError``.

        ``topic`` names another topic of the same project (a public topic);
        the default is the event bus.
        """
        ...


def build_event(event_type: str, data: Mapping[str, Any], *, entity: Entity,
                version: str = "v1", direction: str = "IN") -> Event:
    """Return a validated ``Event``; raise ``InvalidEvent`` for anything the receiver would."""
    if not isinstance(entity, EntityMetadata | Mapping):
        raise InvalidEvent(f"entity must be an object, got {type(entity).__name__}")
    if not isinstance(data, Mapping):
        raise InvalidEvent(f"data must be an object, got {type(data).__name__}")
    meta = entity.to_document() if isinstance(entity, EntityMetadata) else dict(entity)
    body = {"event_type": event_type, "event_version": version, "event_direction": direction,
            "entity_metadata": meta, "entity_data": dict(data)}
    try:
        canonical_json(body)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"event is not JSON-serialisable: {exc}") from None
    return event_from_document(body)


def message_attributes(event_type: str, version: str, key: str,
                       extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a message's attributes: ``extra`` first, the standard three on top."""
    return {**(extra or {}), "event_type": event_type, "event_version": version,
            "idempotency_key": key}


def build_message(event: Event, *, key: str | None = None,
                  extra: Mapping[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """Return the message data and attributes for ``event``; the key is derived if not given.

    Raise ``InvalidEvent`` when the message could never be published or processed:
    a bad key, too many attributes, or data over Pub/Sub's 10 MB.
    """
    attributes = message_attributes(event.event_type, event.event_version,
                                    message_key(event, key), extra)
    try:
        data = canonical_json(event.to_document()).encode()
    except UnicodeEncodeError as exc:
        raise InvalidEvent(f"event holds text that is not valid Unicode: {exc.reason}") from None
    if len(data) > PUBSUB_MAX_DATA_BYTES:
        raise InvalidEvent(f"event is {len(data)} bytes; Pub/Sub takes {PUBSUB_MAX_DATA_BYTES}")
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidEvent(f"{len(attributes)} attributes; Pub/Sub takes {MAX_ATTRIBUTES}")
    return data, attributes
