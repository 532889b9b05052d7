"""The publisher API other services use to put events on the bus.

    from eventbus import publish
    publish("OR_MGMT", {"orderId": 1, ...},
            entity={"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"},
            version="v2", ordering_key="order-1")

The message is built by ``eventbus.pubsub.message`` (validated with the
receiver's own rules). With ``PUBSUB_EMULATOR_HOST`` set, google-cloud-pubsub
talks to the emulator. Needs only google-cloud-pubsub: no Flask, no pymongo, no
pydantic (``publish()`` reads its two variables itself; ``Settings`` is only a type here).

``publish()`` builds a publisher for the call; a service that publishes
often keeps one ``Publisher`` and calls its ``publish`` method. Both refuse,
before sending, an event the service would store FAILED for its size
(``EventTooLarge``, a ``PublishError``) or its content (``InvalidEvent``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from google.cloud import pubsub_v1

from eventbus.correlation import tracecontext
from eventbus.correlation.outbound import outbound_call
from eventbus.model.errors import PublishError
from eventbus.model.event import Event
from eventbus.pubsub.message import Entity, MessagePublisher, build_event, build_message
from eventbus.settings_base import publish_target

if TYPE_CHECKING:  # the settings need pydantic ([service]); a publisher does not
    from eventbus.settings import Settings


class Publisher:
    """Publishes events to one topic through google-cloud-pubsub."""

    def __init__(self, project_id: str, topic: str,
                 client: pubsub_v1.PublisherClient | None = None,
                 timeout: float = 30.0) -> None:
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        self.client = client or pubsub_v1.PublisherClient(publisher_options=options)
        self.project = project_id
        self.topic_path = self.client.topic_path(project_id, topic)
        self.timeout = timeout
        self.host = os.environ.get("PUBSUB_EMULATOR_HOST") or "pubsub.googleapis.com"

    @classmethod
    def from_settings(cls, settings: Settings, timeout: float = 30.0) -> Publisher:
        """Return a publisher for the settings' project and topic."""
        return cls(settings.project_id, settings.topic, timeout=timeout)

    def close(self) -> None:
        """Send what is batched and release the client's resources."""
        self.client.stop()

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

        Raise ``EventTooLarge`` (nothing sent) for an event larger than the
        service stores, ``InvalidEvent`` for other content it would refuse
        (``build_message``). Waits at most ``timeout`` seconds (default
        ``self.timeout``). A timed-out message may still be sent later by the
        client: callers retry, and the receiver deduplicates on the idempotency key.
        """
        data, attrs = build_message(event, key=key, extra=attributes, ordering_key=ordering_key)
        return self.publish_message(data, attrs, ordering_key=ordering_key, timeout=timeout)

    def publish_message(self, data: bytes, attributes: Mapping[str, str] | None = None, *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        """Publish ``data`` as it is, unchecked (relayed children, demos of invalid payloads).

        ``topic`` is another topic of the project (a public topic); default the bus.
        Writes one ``REQUEST_OUTBOUND`` line. Attributes without a ``traceparent``
        get the caller's trace context, so the receiver joins the caller's trace.
        """
        attributes = tracecontext.carried(attributes or {})
        path = self.topic_path if topic is None else self.client.topic_path(self.project, topic)
        try:
            with outbound_call("POST", self.host, f"/v1/{path}:publish",
                               target=path, kind="publish",
                               key=attributes.get("idempotency_key", "")) as answer:
                future = self.client.publish(path, data,
                                             ordering_key=ordering_key or "", **attributes)
                message_id = str(future.result(
                    timeout=self.timeout if timeout is None else timeout))
                answer["status"] = 200
            return message_id
        except Exception as exc:  # the client raises many types; all mean "not published"
            if ordering_key:
                # A failed ordered publish pauses the key until it is resumed.
                self.client.resume_publish(path, ordering_key)
            raise PublishError(f"publish to {path} failed: "
                               f"{type(exc).__name__}: {exc}") from exc


class LazyPublisher:
    """A ``MessagePublisher`` that builds the real one on first use.

    The service starts even where no Pub/Sub credentials can be found (tests,
    a misconfigured deploy): a publisher that cannot be built fails the
    publish, which the relay leaves to the sweeper, instead of the start-up.
    """

    def __init__(self, factory: Callable[[], MessagePublisher]) -> None:
        self._factory = factory
        self._publisher: MessagePublisher | None = None
        self._lock = threading.Lock()

    def publish_message(self, data: bytes, attributes: Mapping[str, str], *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        """Publish through the real publisher, building it first if needed."""
        if topic is None:  # publishers written before public topics take no topic
            return self._get().publish_message(data, attributes, ordering_key=ordering_key,
                                               timeout=timeout)
        return self._get().publish_message(data, attributes, ordering_key=ordering_key,
                                           timeout=timeout, topic=topic)

    def _get(self) -> MessagePublisher:
        with self._lock:
            if self._publisher is None:
                try:
                    self._publisher = self._factory()
                except Exception as exc:  # credentials, bad project: not published
                    raise PublishError(f"cannot build the publisher: {exc}") from exc
            return self._publisher


def publish(event_type: str, data: Mapping[str, Any], *, entity: Entity,
            idempotency_key: str | None = None, ordering_key: str | None = None,
            version: str = "v1", direction: str = "IN",
            settings: Settings | None = None) -> str:
    """Publish one event to the settings' topic; return the message id.

    Without ``settings``, the project and topic are ``GOOGLE_CLOUD_PROJECT`` and
    ``PUBSUB_TOPIC`` (``eventbus.settings_base.publish_target``), read directly.

    Raise ``InvalidEvent`` (nothing sent) for an event the receiver would
    reject; ``EventTooLarge`` (nothing sent; both an ``InvalidEvent`` and a
    ``PublishError``, its message names the size and the limit) for one
    larger than the service stores (``eventbus.model.content.MAX_BYTES``
    once stored, counted as the service counts it) or than Pub/Sub takes:
    never retry those. ``PublishError`` otherwise when Pub/Sub did not take
    it: retry with the same ``idempotency_key`` and the receiver processes it
    once. Builds a client for the call (no process-wide publisher); keep a
    ``Publisher`` to send many.
    """
    # GOOGLE_CLOUD_PROJECT and PUBSUB_TOPIC, read directly: a publisher-only install has
    # no pydantic, so no Settings, and needs no other variable.
    publisher = (Publisher.from_settings(settings) if settings is not None
                 else Publisher(*publish_target()))
    try:
        return publisher.publish(event_type, data, entity=entity,
                                 idempotency_key=idempotency_key, ordering_key=ordering_key,
                                 version=version, direction=direction)
    finally:
        publisher.close()
