"""The recorded sample: JSON lines of stored records, for a CI without a database.

``eventbus verify --record-sample N`` writes one; ``eventbus verify --sample
FILE`` reads it. Each line is one JSON object:

* ``{"kind": "event", "record": {...}}``: a stored event to verify;
* ``{"kind": "parent", "record": {...}}``: a stored event the verified ones
  need (a child's parent, whose outbox lists it), not verified itself;
* ``{"kind": "side_effect", "key": K, "record": {...}}``: a stored guard
  record, whose result the sandbox answers instead of running the effect;
* a bare stored record, or ``{"record": {...}}`` (``eventbus show --json``'s
  shape on one line), counts as an event.

Times are ISO 8601 text (``created`` and ``lastUpdatedTime`` are epoch-ms
text already, as stored). Text is ASCII JSON, so lone surrogates in stored
values survive the round trip as ``\\udXXX`` escapes.

Every line that cannot be used (not UTF-8, not JSON, nested too deeply, a
number too long, not an object, not a record) becomes a ``BadInput`` naming
its line, and the other lines are still used: never a traceback.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from eventbus.model.content import MAX_DEPTH
from eventbus.ops.jsonfile import depth
from eventbus.rebuild.verify.sandbox import MappingLookups

# A record nests a few levels above an event's own data (outbox entries, pubsub).
MAX_RECORD_DEPTH = MAX_DEPTH + 4
_MAX_REASON = 200


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An input item that is not a stored record: where it was, and why (one line)."""

    where: str
    reason: str


@dataclasses.dataclass
class Sample:
    """A sample read: the events to verify, what they may read, and the bad lines."""

    items: list[Mapping[str, Any] | BadInput]
    """The events and the bad lines, in file order (``Verifier.verify`` takes them)."""
    lookups: MappingLookups


def parse_sample(data: bytes, source: str) -> Sample:
    """Read a sample's bytes; every unusable line becomes a ``BadInput`` in its place."""
    items: list[Mapping[str, Any] | BadInput] = []
    events: dict[str, Mapping[str, Any]] = {}
    side_effects: dict[str, Mapping[str, Any]] = {}
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{source}:{number}"
        try:
            kind, key, record = _line(raw)
        except ValueError as exc:
            items.append(BadInput(where, str(exc)[:_MAX_REASON]))
            continue
        if kind == "side_effect":
            side_effects[key] = record
            continue
        events.setdefault(key, record)
        if kind == "event":
            items.append(record)
    return Sample(items, MappingLookups(events, side_effects))


def _line(raw: bytes) -> tuple[str, str, Mapping[str, Any]]:
    """Return (kind, key, record) of one line; ``ValueError`` with the reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except ValueError as exc:  # JSONDecodeError, and ints longer than Python reads
        raise ValueError(f"not JSON: {str(exc).splitlines()[0] if str(exc) else 'unreadable'}") \
            from None
    if depth(value) > MAX_RECORD_DEPTH:
        raise ValueError(f"nests deeper than {MAX_RECORD_DEPTH} levels: no record can")
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    kind = value.get("kind", "event")
    record = value.get("record", value) if "record" in value or "kind" in value else value
    if kind not in ("event", "parent", "side_effect") or not isinstance(record, dict):
        raise ValueError("neither a record nor {kind: event|parent|side_effect, record}")
    key = value.get("key") if kind == "side_effect" else record.get("idempotency_key")
    if not isinstance(key, str) or not key:
        raise ValueError("a record without a key (idempotency_key, or key of a side effect)")
    return kind, key, record


def sample_lines(events: Iterable[Mapping[str, Any]], parents: Mapping[str, Mapping[str, Any]],
                 side_effects: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """The lines of a sample: every event, then the parents and side effects they read."""
    for record in events:
        yield _dump({"kind": "event", "record": record})
    for record in parents.values():
        yield _dump({"kind": "parent", "record": record})
    for key, record in side_effects.items():
        yield _dump({"kind": "side_effect", "key": key, "record": record})


def _dump(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":"),
                      default=_plain)


def _plain(value: Any) -> Any:
    # BSON values a record can hold that JSON cannot: datetimes as ISO text, the rest as text.
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
