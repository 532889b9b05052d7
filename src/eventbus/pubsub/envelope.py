"""Parse a Pub/Sub push request into a ``Delivery``, whatever form it came in.

Three forms are accepted, as functions-framework and Eventarc users expect:

* the wrapped push body ``{"message": {...}, "subscription": ...}``; the
  emulator sends ``"attributes": {}`` where production leaves the field out;
* the unwrapped body (payload unwrapping): the raw data is the body and,
  with ``write_metadata``, metadata arrives as ``x-goog-pubsub-*`` headers and
  attributes as plain headers;
* a CloudEvent ``google.cloud.pubsub.topic.v1.messagePublished``, in binary
  mode (``ce-*`` headers) or structured mode (``specversion`` in the body).

A body that is none of these raises ``RequestError`` (400). A real delivery
whose data is broken is still a ``Delivery``: ``decode_error`` says why, so
the message is stored as FAILED and acked rather than retried forever.
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
# Attributes that the unwrapped form carries as headers; only these are read,
# because every other header belongs to HTTP, not to the message.
KNOWN_ATTRIBUTES = ("event_type", "event_version", "idempotency_key", "parent_key", "root_key")
_MAX_ATTRIBUTES = 100


def parse_delivery(body: bytes, headers: Mapping[str, str]) -> Delivery:
    """Return the ``Delivery`` in a push request, or raise ``RequestError``."""
    lowered = {key.lower(): value for key, value in headers.items()}
    if lowered.get("ce-type"):
        return _binary_cloudevent(body, lowered)
    if "x-goog-pubsub-message-id" in lowered:
        return _unwrapped(body, lowered)
    document = _json(body)
    if isinstance(document, dict) and "specversion" in document:
        return _structured_cloudevent(document)
    if isinstance(document, dict) and "message" in document:
        return _wrapped(document, form="wrapped")
    if isinstance(document, dict) and "event_type" in document:
        return _unwrapped(body, lowered)
    raise RequestError("not a Pub/Sub push: expected {'message': {...}, 'subscription': ...}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise RequestError("body is not JSON and carries no x-goog-pubsub-* headers") from None


def _binary_cloudevent(body: bytes, headers: Mapping[str, str]) -> Delivery:
    if headers["ce-type"] != CLOUDEVENT_TYPE:
        raise RequestError(f"unsupported CloudEvent type {headers['ce-type']!r}")
    document = _json(body)
    if not isinstance(document, dict):
        raise RequestError("CloudEvent data must be a JSON object")
    return _wrapped(document, form="cloudevent")


def _structured_cloudevent(document: dict[str, Any]) -> Delivery:
    if document.get("type") != CLOUDEVENT_TYPE:
        raise RequestError(f"unsupported CloudEvent type {document.get('type')!r}")
    data = document.get("data")
    if not isinstance(data, dict):
        raise RequestError("CloudEvent data must be a JSON object")
    return _wrapped(data, form="cloudevent")


def _wrapped(document: dict[str, Any], form: str) -> Delivery:
    message = document.get("message")
    if not isinstance(message, dict):
        raise RequestError("'message' must be an object")
    message_id = _first(message, "messageId", "message_id")
    if not message_id:
        raise RequestError("'message.messageId' is missing")
    data, error = _base64(message.get("data", ""))
    return Delivery(
        data=data, attributes=_attributes(message.get("attributes")), message_id=message_id,
        publish_time=_first(message, "publishTime", "publish_time"),
        subscription=_text(document.get("subscription", ""), "subscription"),
        delivery_attempt=_attempt(document.get("deliveryAttempt")),
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


def _attributes(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_ATTRIBUTES:
        raise RequestError(f"'message.attributes' must be an object of at most {_MAX_ATTRIBUTES}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise RequestError("'message.attributes' must map strings to strings")
    return dict(value)


def _attempt(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        attempt = int(value)
    except (TypeError, ValueError):
        raise RequestError("'deliveryAttempt' must be a whole number") from None
    if isinstance(value, bool) or attempt < 0:
        raise RequestError("'deliveryAttempt' must be a whole number")
    return attempt


def _base64(value: Any) -> tuple[bytes, str | None]:
    if not isinstance(value, str):
        raise RequestError("'message.data' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True), None
    except (binascii.Error, ValueError):
        return value.encode("utf-8", "replace"), "message.data is not valid base64"
