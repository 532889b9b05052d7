"""The publisher API other services use to put events on the bus.

    from eventbus.publisher import publish
    publish("OR_MGMT", {"orderId": 1, ...},
            entity={"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"},
            version="v2", ordering_key="order-1")

The message is the JSON event (seed 002's shape) with the attributes
``event_type``, ``event_version`` and ``idempotency_key``. It is validated
with the receiver's own rules before it is sent. With
``PUBSUB_EMULATOR_HOST`` set, google-cloud-pubsub talks to the emulator.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from google.cloud import pubsub_v1

from eventbus.config import Settings
from eventbus.errors import PublishError
from eventbus.event import EntityMetadata, Event, parse_event
from eventbus.keys import canonical_json, idempotency_key

Entity = EntityMetadata | Mapping[str, str]


def build_event(event_type: str, data: Mapping[str, Any], *, entity: Entity,
                version: str = "v1", direction: str = "IN") -> Event:
    """Return a validated ``Event``; raise ``InvalidEvent`` for anything the receiver would."""
    meta = entity.to_document() if isinstance(entity, EntityMetadata) else dict(entity)
    body = {"event_type": event_type, "event_version": version, "event_direction": direction,
            "entity_metadata": meta, "entity_data": dict(data)}
    return parse_event(canonical_json(body).encode())


def build_message(event: Event, *, key: str | None = None,
                  extra: Mapping[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """Return the message data and attributes for ``event``; the key is derived if not given."""
    attributes = {**(extra or {}), "event_type": event.event_type,
                  "event_version": event.event_version}
    attributes["idempotency_key"] = idempotency_key(event, {"idempotency_key": key or ""})
    return canonical_json(event.to_document()).encode(), attributes


class Publisher:
    """Publishes events to one topic through google-cloud-pubsub."""

    def __init__(self, project_id: str, topic: str,
                 client: pubsub_v1.PublisherClient | None = None,
                 timeout: float = 30.0) -> None:
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        self.client = client or pubsub_v1.PublisherClient(publisher_options=options)
        self.topic_path = self.client.topic_path(project_id, topic)
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> Publisher:
        """Return a publisher for the settings' project and topic."""
        return cls(settings.project_id, settings.topic)

    def publish(self, event_type: str, data: Mapping[str, Any], *, entity: Entity,
                idempotency_key: str | None = None, ordering_key: str | None = None,
                version: str = "v1", direction: str = "IN",
                attributes: Mapping[str, str] | None = None) -> str:
        """Validate and publish one event; return its Pub/Sub message id."""
        event = build_event(event_type, data, entity=entity, version=version, direction=direction)
        return self.publish_event(event, key=idempotency_key, ordering_key=ordering_key,
                                  attributes=attributes)

    def publish_event(self, event: Event, *, key: str | None = None,
                      ordering_key: str | None = None,
                      attributes: Mapping[str, str] | None = None) -> str:
        """Publish an already validated event; return its message id."""
        data, attrs = build_message(event, key=key, extra=attributes)
        try:
            future = self.client.publish(self.topic_path, data, ordering_key=ordering_key or "",
                                         **attrs)
            return str(future.result(timeout=self.timeout))
        except Exception as exc:  # the client raises many types; all mean "not published"
            if ordering_key:
                self.client.resume_publish(self.topic_path, ordering_key)
            raise PublishError(f"publish to {self.topic_path} failed: {exc}") from exc


_default: Publisher | None = None
_default_lock = threading.Lock()


def publish(event_type: str, data: Mapping[str, Any], *, entity: Entity,
            idempotency_key: str | None = None, ordering_key: str | None = None,
            version: str = "v1", direction: str = "IN") -> str:
    """Publish with a publisher built once from the environment; return the message id."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Publisher.from_settings(Settings.from_env())
    return _default.publish(event_type, data, entity=entity, idempotency_key=idempotency_key,
                            ordering_key=ordering_key, version=version, direction=direction)
