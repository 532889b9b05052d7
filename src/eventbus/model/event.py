"""The event model of seed 002 and its validation.

A payload is a JSON object shaped like a ``partner_events`` document:
``event_type``, ``event_version``, ``event_direction``, ``entity_metadata``
(partner and entity ids) and ``entity_data``, which is kept as-is. The
Pub/Sub attributes ``event_type`` and ``event_version`` may fill the
fields the body leaves out, and must agree with the fields it has.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from eventbus.model.errors import InvalidEvent

DIRECTIONS = ("IN", "OUT")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,127}$")
_VERSION = re.compile(r"^v[0-9]{1,4}$")
_ID_MAX = 256


@dataclasses.dataclass(frozen=True)
class EntityMetadata:
    """Who the event is about: seed 002's ``entity_metadata``, without the attempt map."""

    partner_id: str
    entity_id: str
    entity_type: str
    partner_name: str = ""

    def to_document(self) -> dict[str, Any]:
        """Return the seed's field names, as stored."""
        return {"partnerId": self.partner_id, "partnerName": self.partner_name,
                "entity_id": self.entity_id, "entity_type": self.entity_type}


@dataclasses.dataclass(frozen=True)
class Event:
    """A validated event. ``entity_data`` is the publisher's payload, untouched."""

    event_type: str
    event_version: str
    event_direction: str
    entity_metadata: EntityMetadata
    entity_data: dict[str, Any]

    def to_document(self) -> dict[str, Any]:
        """Return the event as the JSON body a publisher sends."""
        return {"event_type": self.event_type, "event_version": self.event_version,
                "event_direction": self.event_direction,
                "entity_metadata": self.entity_metadata.to_document(),
                "entity_data": self.entity_data}

    def with_version(self, version: str, entity_data: dict[str, Any]) -> Event:
        """Return a copy at ``version`` with new data; upcasters use it."""
        return dataclasses.replace(self, event_version=version, entity_data=entity_data)


def parse_event(data: bytes, attributes: Mapping[str, str] | None = None) -> Event:
    """Validate ``data`` (a JSON payload) into an ``Event`` or raise ``InvalidEvent``."""
    return event_from_document(json_object(data), attributes)


def event_from_document(body: Mapping[str, Any],
                        attributes: Mapping[str, str] | None = None) -> Event:
    """Validate an already decoded event document into an ``Event``, or raise ``InvalidEvent``."""
    attrs = attributes or {}
    return Event(
        event_type=_name(_agreed(body, attrs, "event_type", None)),
        event_version=_version(_agreed(body, attrs, "event_version", "v1")),
        event_direction=_direction(body.get("event_direction", "IN")),
        entity_metadata=_metadata(body.get("entity_metadata")),
        entity_data=_object(body.get("entity_data", {}), "entity_data"),
    )


def json_object(data: bytes) -> dict[str, Any]:
    """Decode ``data`` as a JSON object, or raise ``InvalidEvent`` saying why not."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidEvent(f"payload is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidEvent("payload is nested too deeply to decode") from None
    return _object(body, "payload")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidEvent(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _agreed(body: Mapping[str, Any], attrs: Mapping[str, str], field: str,
            default: str | None) -> str:
    in_body, in_attrs = body.get(field), attrs.get(field)
    if in_body is not None and in_attrs is not None and in_body != in_attrs:
        raise InvalidEvent(f"{field} is {in_body!r} in the body but {in_attrs!r} in the attributes")
    value = in_body if in_body is not None else in_attrs if in_attrs is not None else default
    if value is None:
        raise InvalidEvent(f"{field} is missing")
    return _string(value, field)


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidEvent(f"{what} must be a non-empty string")
    if len(value) > _ID_MAX:
        raise InvalidEvent(f"{what} is longer than {_ID_MAX} characters")
    return value


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise InvalidEvent(f"event_type {value!r} must match {_NAME.pattern}")
    return value


def _version(value: str) -> str:
    if not _VERSION.match(value):
        raise InvalidEvent(f"event_version {value!r} must look like 'v1'")
    return value


def _direction(value: Any) -> str:
    if value not in DIRECTIONS:
        raise InvalidEvent(f"event_direction must be one of {DIRECTIONS}, got {value!r}")
    return str(value)


def _metadata(value: Any) -> EntityMetadata:
    meta = _object(value, "entity_metadata")
    name = meta.get("partnerName", "")
    if not isinstance(name, str):
        raise InvalidEvent("entity_metadata.partnerName must be a string")
    return EntityMetadata(
        partner_id=_string(meta.get("partnerId"), "entity_metadata.partnerId"),
        entity_id=_string(meta.get("entity_id"), "entity_metadata.entity_id"),
        entity_type=_string(meta.get("entity_type"), "entity_metadata.entity_type"),
        partner_name=name,
    )


def lookup(document: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of ``document`` (an event, a record), or None."""
    value: Any = document
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
