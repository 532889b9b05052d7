"""Idempotency keys: how a message is recognised when it comes again.

The rule, in order:

1. the publisher's ``idempotency_key`` attribute, when it has one;
2. otherwise ``<entity_id>:<event_type>:<hash>``, where the hash covers the
   canonical JSON of the whole event. A re-published identical event gets
   the same key, while the next status of the same order is a new event.
   ``messageId`` alone is not enough: a publisher's own retry gets a new one.

A child event emitted by a handler gets ``<parent>/<index>:<child type>``,
so a retried parent produces the same child keys and the child deduplicates.
The relay publishes a child with the attributes ``parent_key`` and
``root_key`` (the key of the event that started the cascade); the receiver
stores them, so an operator can follow a cascade (``python -m eventbus trace``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from eventbus.model.errors import InvalidEvent
from eventbus.model.event import Event

MAX_KEY_LENGTH = 512
_HASH_CHARS = 32
CASCADE_LINKS = ("parent_key", "root_key")


def canonical_json(value: object) -> str:
    """Return ``value`` as JSON with sorted keys and no spaces: equal data, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(text: str | bytes) -> str:
    """Return a short SHA-256 hex digest of ``text``."""
    raw = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(raw).hexdigest()[:_HASH_CHARS]


def idempotency_key(event: Event, attributes: Mapping[str, str]) -> str:
    """Return the key that makes ``event``'s effect happen once."""
    given = attributes.get("idempotency_key", "")
    if given:
        return _checked(given)
    meta = event.entity_metadata
    return f"{meta.entity_id}:{event.event_type}:{digest(canonical_json(event.to_document()))}"


def rejected_key(data: bytes, attributes: Mapping[str, str], message_id: str) -> str:
    """Return the key under which an invalid payload is stored once per message."""
    given = attributes.get("idempotency_key", "")
    if given and len(given) <= MAX_KEY_LENGTH:
        return given
    return f"invalid:{digest(message_id.encode() + b'|' + data)}"


def child_key(parent_key: str, child_type: str, index: int) -> str:
    """Return the stable key of the ``index``-th child of type ``child_type``."""
    key = f"{parent_key}/{index}:{child_type}"
    return key if len(key) <= MAX_KEY_LENGTH else f"{child_type}:{digest(key)}"


def cascade_links(attributes: Mapping[str, str]) -> dict[str, str]:
    """Return the ``parent_key`` and ``root_key`` attributes that are usable keys.

    They only describe the cascade, so a malformed one is dropped rather than
    failing the event.
    """
    return {name: value for name in CASCADE_LINKS
            if (value := attributes.get(name, "")) and _usable(value)}


def _usable(key: str) -> bool:
    return len(key) <= MAX_KEY_LENGTH and key.isprintable()


def _checked(key: str) -> str:
    if not _usable(key):
        raise InvalidEvent(f"idempotency_key must be printable and at most {MAX_KEY_LENGTH} chars")
    return key
