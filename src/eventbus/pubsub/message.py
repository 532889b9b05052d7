"""The standard message of the bus, built without any Google client.

JSON body (seed 002's event shape) and the attributes ``event_type``,
``event_version`` and ``idempotency_key`` (plus ``parent_key``/``root_key``
for children). Validated with the receiver's own rules, so an event the
service would reject never leaves a publisher: its content is checked as
the service checks it before storing (``eventbus.model.content``), and an
event larger than the service stores raises ``EventTooLarge`` before
anything is sent (``stored_size`` says how the size is counted). The
publisher, the relay, the CLI and the test bus all build messages here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from eventbus.model import content
from eventbus.model.delivery import Delivery
from eventbus.model.errors import ContentProblem, EventTooLarge, InvalidEvent
from eventbus.model.event import EntityMetadata, Event, event_from_document, parse_event
from eventbus.model.keys import canonical_json, message_key
from eventbus.settings_base import PUBSUB_MAX_DATA_BYTES

Entity = EntityMetadata | Mapping[str, str]
# Pub/Sub's own cap; the publisher adds three attributes, the relay two more.
MAX_ATTRIBUTES = 100
_MIB = 1024 * 1024
# What the receiver stores beside the event (``Delivery.pubsub_document``) that a publisher
# cannot know yet, each at its longest: the broker's fields, and the trace context that
# ``Publisher.publish_message`` adds (W3C's traceparent and tracestate, Google's copy). An
# event the publisher lets through is then one the service stores.
_BROKER_FIELDS: dict[str, Any] = {"message_id": "0" * 64, "publish_time": "0" * 40,
                                  "subscription": "0" * 320, "delivery_attempt": 0,
                                  "form": "cloudevent"}
_TRACE_AT_LONGEST = {"traceparent": "0" * 55, "tracestate": "0" * 512,
                     "googclient_traceparent": "0" * 55}


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
                  extra: Mapping[str, str] | None = None,
                  ordering_key: str | None = None) -> tuple[bytes, dict[str, str]]:
    """Return the message data and attributes for ``event``; the key is derived if not given.

    Raise ``InvalidEvent`` when the message could never be published or processed:
    a bad key, too many attributes, content the service would store refused
    (``ContentProblem``: nested too deep, an integer past 64 bits, NUL in a key),
    or an event too large (``EventTooLarge``, also a ``PublishError``): over
    Pub/Sub's 10 MB, or over what the service stores once it is received
    (``stored_size`` above ``content.MAX_BYTES``; exactly at it is taken).
    ``ordering_key`` is the one it will be published with: the service stores it too.
    """
    attributes = message_attributes(event.event_type, event.event_version,
                                    message_key(event, key), extra)
    try:
        text = canonical_json(event.to_document())
        data = text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidEvent(f"event holds text that is not valid Unicode: {exc.reason}") from None
    if len(data) > PUBSUB_MAX_DATA_BYTES:
        raise EventTooLarge(f"event {event.event_type} is {len(data)} bytes; Pub/Sub takes at "
                            f"most {PUBSUB_MAX_DATA_BYTES} bytes: nothing was published",
                            size=len(data), limit=PUBSUB_MAX_DATA_BYTES)
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidEvent(f"{len(attributes)} attributes; Pub/Sub takes {MAX_ATTRIBUTES}")
    _check_storable(event.event_type, data, attributes, ordering_key, text)
    return data, attributes


def stored_size(data: bytes, attributes: Mapping[str, str],
                ordering_key: str | None = None) -> int:
    """Return the size the service counts for this message once stored, in estimated bytes.

    As the receiver counts it (``eventbus.processor.intake``): the event it
    parses from ``data`` and the Pub/Sub metadata stored beside it, the
    broker's fields and the trace context counted at their longest. The
    service stores at most ``content.MAX_BYTES`` (8 MiB); ``build_message``
    refuses a message above it. Raise ``InvalidEvent`` for data that is no event.
    """
    return content.stored_size(_as_stored(data, attributes, ordering_key))


def _check_storable(event_type: str, data: bytes, attributes: Mapping[str, str],
                    ordering_key: str | None, text: str) -> None:
    """Raise what the service would store the message FAILED for, checked as it checks.

    The common case costs what the receiver's does: a few scans of the text
    (``content.surely_storable``); only a large or unusual event is walked.
    """
    pubsub = _received_pubsub(attributes, ordering_key)
    if content.surely_storable(text + canonical_json(pubsub)):
        return
    document = _as_stored(data, attributes, ordering_key)
    found = content.problem(document)
    if found is None:
        return
    size = content.stored_size(document)
    if size > content.MAX_BYTES:
        raise EventTooLarge(
            f"event {event_type} is {size} bytes once stored ({size / _MIB:.1f} MiB, as the "
            f"service counts it); the service stores at most {content.MAX_BYTES} bytes "
            f"({content.MAX_BYTES / _MIB:g} MiB): nothing was published",
            size=size, limit=content.MAX_BYTES)
    raise ContentProblem(f"the service cannot store the event as it is: {found}")


def _as_stored(data: bytes, attributes: Mapping[str, str],
               ordering_key: str | None) -> dict[str, Any]:
    # What the receiver checks before storing: the event parsed as it parses it, and
    # the delivery's Pub/Sub document.
    return {"event": parse_event(data, attributes).to_document(),
            "pubsub": _received_pubsub(attributes, ordering_key)}


def _received_pubsub(attributes: Mapping[str, str], ordering_key: str | None) -> dict[str, Any]:
    received = {**{name: value for name, value in _TRACE_AT_LONGEST.items()
                   if name not in attributes}, **attributes}
    return Delivery(data=b"", attributes=received, ordering_key=ordering_key or "",
                    **_BROKER_FIELDS).pubsub_document()
