"""Idempotency keys: how a message is recognised again, in a key space outsiders cannot take.

Every key a record is stored under has one of four shapes, and no shape can
be produced from another's inputs:

1. ``p:<partner>:<message key>`` for a publisher's event. The message key is
   the publisher's ``idempotency_key`` attribute when it has one, otherwise
   ``<entity_id>:<event_type>:<hash>`` (the hash covers the canonical JSON of
   the whole event, so a re-published identical event gets the same key while
   the next status of the same order is a new event). ``<partner>`` is the
   percent-encoded ``partnerId``, so one partner's keys can never be another's.
   A publisher's key may not contain ``/<number>:`` (the shape of a child's key).
2. ``<parent key>/<index>:<child type>`` for a child a handler emitted
   (``c:<hash>`` when that would be too long), accepted only when the parent's
   outbox lists it (``eventbus.processor`` checks).
3. ``invalid:<hash>`` for a payload that is not a valid event, once per payload:
   the hash covers its bytes and the attributes the receiver reads
   (``KEYED_ATTRIBUTES``), not the message id, so a redelivery or the same
   bytes published again find the record the first delivery made.
4. ``conflict:<hash>`` for a different payload that came under a taken key.

``fingerprint(event)`` identifies a payload: a different payload under a taken
key is a recorded conflict, never a silent duplicate. Keys and digests
accept any text, lone surrogates included.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from urllib.parse import quote

from eventbus.model.errors import InvalidEvent
from eventbus.model.event import Event

MAX_KEY_LENGTH = 512
_HASH_CHARS = 32
CASCADE_LINKS = ("parent_key", "root_key")
REPLAY_OF = "replay_of"
"""The attribute of an operator's corrected replay: the key of the refused record it corrects.

Trusted only when that record's replay audit lists the message's payload
(``Intake``), as a cascade link is trusted only when its parent lists the child."""
KEYED_ATTRIBUTES = ("event_type", "event_version", "idempotency_key", "parent_key", "root_key",
                    REPLAY_OF)
"""The attributes the receiver reads a payload with; with its bytes, they key a refused one.

Any other attribute (the trace context each publish carries, a client's
own) changes nothing in how the bytes are read, so it is left out of
``rejected_key``: the same bytes published again are the same refusal."""
PUBLISHER_PREFIX = "p:"
INVALID_PREFIX = "invalid:"
CONFLICT_PREFIX = "conflict:"
# The shape that only a child's key has: "/<index>:" after the parent key.
_CHILD_SHAPE = re.compile(r"/[0-9]+:")
# One encoder for every canonical text: ``json.dumps`` with options builds a new one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: object) -> str:
    """Return ``value`` as JSON with sorted keys and no spaces: equal data, equal text."""
    return _CANONICAL.encode(value)


def any_text_bytes(text: str) -> bytes:
    """Return ``text`` as UTF-8, lone surrogates included (they come from JSON escapes)."""
    return text.encode("utf-8", "surrogatepass")


def digest(text: str | bytes) -> str:
    """Return a short SHA-256 hex digest of ``text`` (any text)."""
    raw = any_text_bytes(text) if isinstance(text, str) else text
    return hashlib.sha256(raw).hexdigest()[:_HASH_CHARS]


def fingerprint(event: Event) -> str:
    """Return the SHA-256 of the event's canonical JSON: equal payloads, equal fingerprints."""
    return fingerprint_document(event.to_document())


def fingerprint_document(document: Mapping[str, object]) -> str:
    """Return the fingerprint of an event document (``Event.to_document()``'s shape)."""
    return fingerprint_text(canonical_json(document))


def fingerprint_text(text: str) -> str:
    """Return the fingerprint of an event's canonical JSON (``canonical_json``'s text)."""
    return hashlib.sha256(any_text_bytes(text)).hexdigest()


def message_key(event: Event, given: str | None = None) -> str:
    """Return the key a publisher sends: ``given`` (checked) or one derived from the event."""
    if given:
        return _checked(given)
    meta = event.entity_metadata
    return f"{meta.entity_id}:{event.event_type}:{digest(canonical_json(event.to_document()))}"


def record_key(event: Event, attributes: Mapping[str, str]) -> str:
    """Return the key a publisher's event is stored under: its message key, scoped by partner."""
    key = message_key(event, attributes.get("idempotency_key", ""))
    return f"{PUBLISHER_PREFIX}{partner_scope(event.entity_metadata.partner_id)}:{key}"


def partner_scope(partner_id: str) -> str:
    """Return ``partner_id`` percent-encoded: no ``:`` or ``/`` can remain in it."""
    return quote(any_text_bytes(partner_id), safe="")


def rejected_key(data: bytes, attributes: Mapping[str, str] | None = None, *,
                 undecodable: bool = False) -> str:
    """Return the key under which an invalid payload is stored, once per payload.

    The same ``data`` with the same ``KEYED_ATTRIBUTES`` has the same key,
    whatever its message id: a redelivery, or the same bytes published
    again, is one record, which counts its deliveries (``delivery_count``).
    Different bytes, or the same bytes read differently (another
    ``event_type`` attribute, a cascade link, data that was not even valid
    base64: ``undecodable``), have another key. Any text, lone surrogates included.
    """
    given = attributes or {}
    read = {name: given[name] for name in KEYED_ATTRIBUTES if name in given}
    # The head's length first: no head and data can be read as another's.
    head = any_text_bytes(canonical_json([read, undecodable]))
    return f"{INVALID_PREFIX}{digest(b'%d:' % len(head) + head + data)}"


def conflict_key(key: str, payload_fingerprint: str) -> str:
    """Return the key under which a different payload that came under ``key`` is recorded."""
    return f"{CONFLICT_PREFIX}{digest(key + '|' + payload_fingerprint)}"


def child_key(parent_key: str, child_type: str, index: int) -> str:
    """Return the stable key of the ``index``-th child of type ``child_type``."""
    key = f"{parent_key}/{index}:{child_type}"
    return key if len(key) <= MAX_KEY_LENGTH else f"c:{digest(key)}"


def cascade_links(attributes: Mapping[str, str]) -> dict[str, str]:
    """Return the ``parent_key`` and ``root_key`` attributes that are usable keys.

    They are claims only: the processor accepts a child only where the parent's
    outbox lists it. A malformed one is dropped rather than failing the event.
    """
    return {name: value for name in CASCADE_LINKS
            if (value := attributes.get(name, "")) and _usable(value)}


def _usable(key: str) -> bool:
    return len(key) <= MAX_KEY_LENGTH and key.isprintable()


def _checked(key: str) -> str:
    if not _usable(key):
        raise InvalidEvent(f"idempotency_key must be printable and at most {MAX_KEY_LENGTH} chars")
    if _CHILD_SHAPE.search(key):
        raise InvalidEvent("idempotency_key may not contain '/<number>:' (the shape of a "
                           "child's key, which only the relay sends)")
    return key
