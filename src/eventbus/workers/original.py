"""The message a stored record came from, rebuilt: what a redrive and a replay publish.

The body is the record's stored event fields, the attributes its stored
attributes (``pubsub.attributes``: the original key, the cascade links;
rebuilt for older records), and the ordering key its stored one. The message
is checked to land on the record's own key (``Intake.locate``, or the key
rules when no app is given); a record that cannot be rebuilt raises
``NotReplayable`` and is left as it is.

Used by the redrive sweeper (``eventbus.workers.redrive``) and by the
operator's replay (``eventbus.ops.replay``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any

from eventbus.model.delivery import FIRST_PUBLISH_TIME, Delivery, earliest
from eventbus.model.errors import EventBusError, InvalidEvent
from eventbus.model.event import Event, event_from_document
from eventbus.model.keys import canonical_json
from eventbus.processor import Located
from eventbus.pubsub.message import message_attributes

Locator = Callable[[Delivery], Located]


@dataclasses.dataclass(frozen=True)
class Message:
    """A message to publish again: body, attributes, ordering key, and its target key."""

    data: bytes
    attributes: dict[str, str]
    ordering_key: str | None
    key: str


class NotReplayable(EventBusError):
    """Raised when a record cannot be turned back into the message it came from."""


def stored_event(record: Mapping[str, Any]) -> Event:
    """Return the event a record holds, validated as the receiver validates it."""
    if "raw_payload" in record or str(record.get("idempotency_key", "")).startswith("invalid:"):
        raise NotReplayable("stored as invalid: replay it with corrected data (--data FILE)")
    try:
        return event_from_document(record)
    except InvalidEvent as exc:
        raise NotReplayable(f"the stored event does not validate: {exc}") from None


def stored_attributes(record: Mapping[str, Any], event: Event) -> dict[str, str]:
    """Return the attributes the record's message came with (rebuilt for older records)."""
    pubsub = record.get("pubsub")
    given = pubsub.get("attributes") if isinstance(pubsub, Mapping) else None
    if isinstance(given, Mapping):
        return {str(name): str(value) for name, value in given.items()}
    links = {name: str(record[name]) for name in ("parent_key", "root_key") if record.get(name)}
    # Without stored attributes the original key is known only when it was derived.
    return message_attributes(event.event_type, event.event_version, "", links)


def ordering_key(record: Mapping[str, Any]) -> str | None:
    """Return the ordering key the record's message came with, or None."""
    pubsub = record.get("pubsub")
    ordering = pubsub.get("orderingKey") if isinstance(pubsub, Mapping) else None
    return str(ordering) if ordering else None


def build(record: Mapping[str, Any], locate: Locator, *, keep_age: bool = True) -> Message:
    """Return the message that republishes ``record``; ``NotReplayable`` when there is none.

    ``keep_age`` (the redrive's): the message carries the first publish time of the
    record's event (``FIRST_PUBLISH_TIME``), from which a route's ``max_age`` counts.
    False (an operator's replay, which runs the event now): it carries none.
    """
    event = stored_event(record)
    attributes = _without_empty_key(stored_attributes(record, event))
    attributes.pop(FIRST_PUBLISH_TIME, None)
    first = first_publish_time(record) if keep_age else None
    if first:
        attributes[FIRST_PUBLISH_TIME] = first
    data = canonical_json(event.to_document()).encode()
    return _checked(Message(data, attributes, ordering_key(record), ""), record, locate)


def first_publish_time(record: Mapping[str, Any]) -> str | None:
    """The first publish time of ``record``'s event: the earlier of its stored message's
    ``first_publish_time`` attribute (an earlier redrive's) and its ``publishTime``."""
    # The claim stores each delivery's publishTime over the last, so the first one lives
    # on only in the attribute once the event has been redriven.
    pubsub = record.get("pubsub")
    if not isinstance(pubsub, Mapping):
        return None
    given = pubsub.get("attributes")
    first = given.get(FIRST_PUBLISH_TIME) if isinstance(given, Mapping) else None
    moment = earliest(first, pubsub.get("publishTime"))
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _without_empty_key(attributes: dict[str, str]) -> dict[str, str]:
    if not attributes.get("idempotency_key"):
        attributes.pop("idempotency_key", None)
    return attributes


def _checked(message: Message, record: Mapping[str, Any], locate: Locator) -> Message:
    key = str(record.get("idempotency_key"))
    located = locate(Delivery(message.data, message.attributes, message_id="replay"))
    if located.error is not None:
        raise NotReplayable(f"the receiver would refuse it: {located.error}")
    if located.key != key:
        raise NotReplayable(f"it would be stored under {located.key!r}, not under its own key")
    return dataclasses.replace(message, key=key)
