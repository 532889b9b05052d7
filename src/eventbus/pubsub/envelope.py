"""Parse a Pub/Sub push request into a ``Delivery``, whatever form it came in.

Four forms are accepted, as functions-framework and Eventarc users expect
(``Delivery.form`` names which one it was):

* ``wrapped``: the push body ``{"message": {...}, "subscription": ...}``; the
  emulator sends ``"attributes": {}`` where production leaves the field out;
* ``unwrapped`` (payload unwrapping): the raw data is the body and, with
  ``write_metadata``, metadata arrives as ``x-goog-pubsub-*`` headers and
  attributes as plain headers;
* ``cloudevent``: a CloudEvent ``google.cloud.pubsub.topic.v1.messagePublished``,
  in binary mode (``ce-*`` headers) or structured mode (``specversion`` in the
  body). When its ``message`` has no ``messageId`` or ``publishTime``, the
  CloudEvent's own ``id`` and ``time`` (``ce-id``/``ce-time`` in binary mode)
  stand in, as functions-framework converts them;
* ``background``: the legacy background-function event
  ``{"context": {"eventId", "timestamp", "eventType", "resource"}, "data":
  <PubsubMessage>}``, or the same fields at the top level. ``eventId`` and
  ``timestamp`` stand in for the message id and publish time.

The forms are read by hand rather than with the ``cloudevents`` SDK: the
Pub/Sub message still has to be dug out of each form, and the SDK would add a
dependency and its own exceptions without removing any of that.

A body that is none of these raises ``RequestError`` (400); so does a body
nested too deep to parse. A real delivery whose data is broken is still a
``Delivery``: ``decode_error`` says why, so the message is stored as FAILED
and acked rather than retried forever. Broker metadata that cannot be used
(a ``deliveryAttempt`` that is not a whole number in 0..2**31-1) is ignored:
answering 400 to a real delivery would only make the broker send it again.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import RequestError

CLOUDEVENT_TYPE = "google.cloud.pubsub.topic.v1.messagePublished"
BACKGROUND_TYPES = ("google.pubsub.topic.publish",
                    "providers/cloud.pubsub/eventTypes/topic.publish")
"""The legacy event types of a Pub/Sub message (functions-framework's mapping)."""
PUBSUB_MESSAGE_TYPE = "type.googleapis.com/google.pubsub.v1.PubsubMessage"
# Attributes that the unwrapped form carries as headers; only these are read,
# because every other header belongs to HTTP, not to the message.
KNOWN_ATTRIBUTES = ("event_type", "event_version", "idempotency_key", "parent_key", "root_key")
MAX_DELIVERY_ATTEMPT = 2**31 - 1
"""``deliveryAttempt`` is an int32 in Pub/Sub's API; larger values are ignored."""
_MAX_ATTRIBUTES = 100
_NOT_A_PUSH = "not a Pub/Sub push: expected {'message': {...}, 'subscription': ...}"


def parse_delivery(body: bytes, headers: Mapping[str, str]) -> Delivery:
    """Return the ``Delivery`` in a push request, or raise ``RequestError``."""
    lowered = {key.lower(): value for key, value in headers.items()}
    if lowered.get("ce-type"):
        return _binary_cloudevent(body, lowered)
    if "x-goog-pubsub-message-id" in lowered:
        return _unwrapped(body, lowered)
    document = _json(body)
    if not isinstance(document, dict):
        raise RequestError(_NOT_A_PUSH)
    if "specversion" in document:
        return _structured_cloudevent(document)
    if "message" in document:
        return _wrapped(document, form="wrapped")
    if "event_type" in document:
        return _unwrapped(body, lowered)
    if isinstance(document.get("context"), dict) or "eventType" in document:
        return _background(document)
    raise RequestError(_NOT_A_PUSH)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise RequestError("body is not JSON and carries no x-goog-pubsub-* headers") from None
    except RecursionError:
        raise RequestError("body is nested too deeply to be a Pub/Sub push") from None


def _binary_cloudevent(body: bytes, headers: Mapping[str, str]) -> Delivery:
    if headers["ce-type"] != CLOUDEVENT_TYPE:
        raise RequestError(f"unsupported CloudEvent type {_shown(headers['ce-type'])}")
    document = _json(body)
    if not isinstance(document, dict):
        raise RequestError("CloudEvent data must be a JSON object")
    return _wrapped(document, form="cloudevent", message_id=headers.get("ce-id", ""),
                    publish_time=headers.get("ce-time", ""))


def _structured_cloudevent(document: dict[str, Any]) -> Delivery:
    if document.get("type") != CLOUDEVENT_TYPE:
        raise RequestError(f"unsupported CloudEvent type {_shown(document.get('type'))}")
    data = document.get("data")
    if not isinstance(data, dict):
        raise RequestError("CloudEvent data must be a JSON object")
    return _wrapped(data, form="cloudevent", message_id=_optional(document.get("id")),
                    publish_time=_optional(document.get("time")))


def _background(document: dict[str, Any]) -> Delivery:
    context = document["context"] if isinstance(document.get("context"), dict) else document
    if context.get("eventType") not in BACKGROUND_TYPES:
        raise RequestError(f"unsupported background event type {_shown(context.get('eventType'))}")
    data = document.get("data")
    if not isinstance(data, dict) or data.get("@type", PUBSUB_MESSAGE_TYPE) != PUBSUB_MESSAGE_TYPE:
        raise RequestError(f"background event data must be a {PUBSUB_MESSAGE_TYPE} object")
    return _message(data, form="background", message_id=_optional(context.get("eventId")),
                    publish_time=_optional(context.get("timestamp")))


def _wrapped(document: dict[str, Any], form: str, message_id: str = "",
             publish_time: str = "") -> Delivery:
    message = document.get("message")
    if not isinstance(message, dict):
        raise RequestError("'message' must be an object")
    return _message(message, form=form, message_id=message_id, publish_time=publish_time,
                    subscription=_text(document.get("subscription", ""), "subscription"),
                    attempt=_attempt(document.get("deliveryAttempt")))


def _message(message: dict[str, Any], *, form: str, message_id: str, publish_time: str,
             subscription: str = "", attempt: int | None = None) -> Delivery:
    """Read one PubsubMessage; ``message_id`` and ``publish_time`` stand in for missing ones."""
    message_id = _first(message, "messageId", "message_id") or message_id
    if not message_id:
        raise RequestError("'message.messageId' is missing")
    data, error = _base64(message.get("data", ""))
    return Delivery(
        data=data, attributes=_attributes(message.get("attributes")), message_id=message_id,
        publish_time=_first(message, "publishTime", "publish_time") or publish_time,
        subscription=subscription, delivery_attempt=attempt,
        ordering_key=_first(message, "orderingKey", "ordering_key"),
        form=form, decode_error=error,
    )


def _unwrapped(body: bytes, headers: Mapping[str, str]) -> Delivery:
    attributes = {name: headers[name] for name in KNOWN_ATTRIBUTES if name in headers}
    attributes.update({name: headers[name.replace("_", "-")] for name in KNOWN_ATTRIBUTES
                       if name.replace("_", "-") in headers})
    return Delivery(
        data=body, attributes=attributes,
        message_id=headers.get("x-goog-pubsub-message-id", ""),
        publish_time=headers.get("x-goog-pubsub-publish-time", ""),
        subscription=headers.get("x-goog-pubsub-subscription-name", ""),
        delivery_attempt=_attempt(headers.get("x-goog-pubsub-delivery-attempt")),
        ordering_key=headers.get("x-goog-pubsub-ordering-key", ""),
        form="unwrapped",
    )


def _first(message: Mapping[str, Any], *names: str) -> str:
    for name in names:
        if message.get(name) is not None:
            return _text(message[name], f"message.{name}")
    return ""


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"'{what}' must be a string")
    return value


def _optional(value: Any) -> str:
    """Return a stand-in field (a CloudEvent's ``id``, an ``eventId``) if it is text, else ''."""
    return value if isinstance(value, str) else ""


def _shown(value: Any) -> str:
    """Return a short, safe rendering of a value a client sent, for an error message."""
    return repr(value[:80]) if isinstance(value, str) else f"of type {type(value).__name__}"


def _attributes(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_ATTRIBUTES:
        raise RequestError(f"'message.attributes' must be an object of at most {_MAX_ATTRIBUTES}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise RequestError("'message.attributes' must map strings to strings")
    return dict(value)


def _attempt(value: Any) -> int | None:
    """Return the broker's delivery attempt, or None when it is absent or unusable.

    A JSON integer or a string of ASCII digits in 0..``MAX_DELIVERY_ATTEMPT``
    counts; anything else (a float, ``Infinity``, ``1e20``, a negative, a
    boolean) is ignored rather than refused, because the delivery is real.
    """
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip()) if len(value.strip()) <= 10 else None
    if isinstance(value, int) and not isinstance(value, bool) \
            and 0 <= value <= MAX_DELIVERY_ATTEMPT:
        return value
    return None


def _base64(value: Any) -> tuple[bytes, str | None]:
    if not isinstance(value, str):
        raise RequestError("'message.data' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True), None
    except (binascii.Error, ValueError):
        return value.encode("utf-8", "replace"), "message.data is not valid base64"
