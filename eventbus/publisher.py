"""The publisher API other services use to put events on the bus.

    from eventbus.publisher import publish
    publish("OR_MGMT", {"orderId": 1, ...},
            entity={"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"},
            version="v2", ordering_key="order-1")

The message is the JSON event (seed 002's shape) with the attributes
``event_type``, ``event_version`` and ``idempotency_key``. It is validated
with the receiver's own rules before it is sent, so an event the service
would reject never leaves the publisher. With ``PUBSUB_EMULATOR_HOST`` set,
google-cloud-pubsub talks to the emulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from google.cloud import pubsub_v1

from eventbus.config import PUBSUB_MAX_DATA_BYTES, Settings
from eventbus.errors import InvalidEvent, PublishError
from eventbus.event import EntityMetadata, Event, parse_event
from eventbus.keys import canonical_json, idempotency_key

Entity = EntityMetadata | Mapping[str, str]
# Pub/Sub's own cap; the publisher adds three attributes, the relay two more.
MAX_ATTRIBUTES = 100


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
        text = canonical_json(body)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"event is not JSON-serialisable: {exc}") from None
    return parse_event(text.encode())


def build_message(event: Event, *, key: str | None = None,
                  extra: Mapping[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """Return the message data and attributes for ``event``; the key is derived if not given.

    Raise ``InvalidEvent`` when the message could never be published or processed:
    a bad key, too many attributes, or data over Pub/Sub's 10 MB.
    """
    attributes = {**(extra or {}), "event_type": event.event_type,
                  "event_version": event.event_version}
    attributes["idempotency_key"] = idempotency_key(event, {"idempotency_key": key or ""})
    data = canonical_json(event.to_document()).encode()
    if len(data) > PUBSUB_MAX_DATA_BYTES:
        raise InvalidEvent(f"event is {len(data)} bytes; Pub/Sub takes {PUBSUB_MAX_DATA_BYTES}")
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidEvent(f"{len(attributes)} attributes; Pub/Sub takes {MAX_ATTRIBUTES}")
    return data, attributes


class EventPublisher(Protocol):
    """What the relay needs from a publisher; tests pass a fake."""

    def publish_event(self, event: Event, *, key: str | None = None,
                      ordering_key: str | None = None,
                      attributes: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> str:
        """Publish ``event``; return its message id or raise ``PublishError``."""
        ...


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
    def from_settings(cls, settings: Settings, timeout: float = 30.0) -> Publisher:
        """Return a publisher for the settings' project and topic."""
        return cls(settings.project_id, settings.topic, timeout=timeout)

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
                      attributes: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> str:
        """Publish an already validated event; return its message id.

        Waits at most ``timeout`` seconds (default ``self.timeout``). A timed-out
        message may still be sent later by the client: callers retry, and the
        receiver deduplicates on the idempotency key.
        """
        data, attrs = build_message(event, key=key, extra=attributes)
        return self.publish_raw(data, attrs, ordering_key=ordering_key, timeout=timeout)

    def publish_raw(self, data: bytes, attributes: Mapping[str, str] | None = None, *,
                    ordering_key: str | None = None, timeout: float | None = None) -> str:
        """Publish ``data`` as it is, unchecked (demos of invalid payloads); return its id."""
        try:
            future = self.client.publish(self.topic_path, data, ordering_key=ordering_key or "",
                                         **(attributes or {}))
            return str(future.result(timeout=self.timeout if timeout is None else timeout))
        except Exception as exc:  # the client raises many types; all mean "not published"
            if ordering_key:
                # A failed ordered publish pauses the key until it is resumed.
                self.client.resume_publish(self.topic_path, ordering_key)
            raise PublishError(f"publish to {self.topic_path} failed: "
                               f"{type(exc).__name__}: {exc}") from exc


class LazyPublisher:
    """An ``EventPublisher`` that builds the real one on first use.

    The service starts even where no Pub/Sub credentials can be found (tests,
    a misconfigured deploy): a publisher that cannot be built fails the
    publish, which the relay leaves to the sweeper, instead of the start-up.
    """

    def __init__(self, factory: Callable[[], EventPublisher]) -> None:
        self._factory = factory
        self._publisher: EventPublisher | None = None
        self._lock = threading.Lock()

    def publish_event(self, event: Event, *, key: str | None = None,
                      ordering_key: str | None = None,
                      attributes: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> str:
        """Publish through the real publisher, building it first if needed."""
        return self._get().publish_event(event, key=key, ordering_key=ordering_key,
                                         attributes=attributes, timeout=timeout)

    def _get(self) -> EventPublisher:
        with self._lock:
            if self._publisher is None:
                try:
                    self._publisher = self._factory()
                except Exception as exc:  # credentials, bad project: not published
                    raise PublishError(f"cannot build the publisher: {exc}") from exc
            return self._publisher


_default: Publisher | None = None
_default_lock = threading.Lock()


def publish(event_type: str, data: Mapping[str, Any], *, entity: Entity,
            idempotency_key: str | None = None, ordering_key: str | None = None,
            version: str = "v1", direction: str = "IN") -> str:
    """Publish with a publisher built once from the environment; return the message id.

    Raise ``InvalidEvent`` (nothing sent) for an event the receiver would
    reject, ``PublishError`` when Pub/Sub did not take it: retry with the same
    ``idempotency_key`` and the receiver processes it once.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Publisher.from_settings(Settings.from_env())
    return _default.publish(event_type, data, entity=entity, idempotency_key=idempotency_key,
                            ordering_key=ordering_key, version=version, direction=direction)
