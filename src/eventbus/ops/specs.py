"""Event specs: events an operator (or the demo) writes as JSON, read and published.

``eventbus publish FILE|-`` and the local demo (``handlers/demo.py``) take a
JSON file holding one spec or a list of them. A spec is ``{"event_type",
"entity": {partnerId, entity_id, entity_type, partnerName?}, "data"?,
"event_version"?, "event_direction"?, "idempotency_key"?, "ordering_key"?}``;
``{"raw": "..."}`` publishes a string as it is (to show how invalid payloads
are stored; the same raw string published again lands on the same record,
which counts its deliveries).

An event the service would refuse for its content is not published: one
larger than the service stores prints its size and the limit
(``EventTooLarge``, from ``eventbus.pubsub.message.build_message``) and
counts as not published (exit 1), not as a Pub/Sub failure.

* ``load_specs``: read the specs of a file (or stdin); ``InputError`` when
  they cannot be read at all;
* ``spec_event``: the validated event of one spec;
* ``publish_spec``: publish one spec, return the key it will be stored under;
* ``publish_all``: publish every spec, one line each, and give up on the rest
  after a few publish failures in a row.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from eventbus.model.errors import EventBusError, InvalidEvent, PublishError
from eventbus.model.event import Event
from eventbus.model.keys import record_key, rejected_key
from eventbus.ops import jsonfile
from eventbus.pubsub.message import MessagePublisher, build_event, build_message

PROGRESS_EVERY = 100
# After this many publish failures in a row Pub/Sub is taken to be down, and
# the rest of the batch is not tried (each try would wait for its timeout).
MAX_FAILURES_IN_A_ROW = 3
SPEC_FIELDS = ("event_type", "entity")


class InputError(Exception):
    """Raised when the events to publish cannot be read; exit status 2."""


def load_specs(source: str) -> list[dict[str, Any]]:
    """Read event specs from a path, or from stdin when ``source`` is ``-``."""
    try:
        loaded = jsonfile.loads(jsonfile.read_text(source), source)
    except jsonfile.Unreadable as exc:
        raise InputError(str(exc)) from None
    specs = loaded if isinstance(loaded, list) else [loaded]
    if not specs:
        raise InputError(f"{source} holds an empty list: nothing to publish")
    for number, spec in enumerate(specs, 1):
        if not isinstance(spec, dict):
            raise InputError(f"{source}: event #{number} is {type(spec).__name__}, "
                             "not an event object")
    return specs


def spec_event(spec: Mapping[str, Any]) -> Event:
    """Return the validated event of a spec, or raise ``InvalidEvent`` saying what is wrong."""
    missing = [name for name in SPEC_FIELDS if name not in spec]
    if missing:
        raise InvalidEvent(f"missing {' and '.join(missing)}")
    return build_event(spec["event_type"], spec.get("data", {}), entity=spec["entity"],
                       version=spec.get("event_version", "v1"),
                       direction=spec.get("event_direction", "IN"))


def publish_spec(publisher: MessagePublisher, spec: Mapping[str, Any]) -> str:
    """Publish one spec; return the idempotency key it will be stored under."""
    if "raw" in spec:
        data = str(spec["raw"]).encode()
        publisher.publish_message(data, {})
        return rejected_key(data, {})
    event = spec_event(spec)
    given, ordering = _optional_text(spec, "idempotency_key"), _optional_text(spec, "ordering_key")
    data, attributes = build_message(event, key=given, ordering_key=ordering)
    publisher.publish_message(data, attributes, ordering_key=ordering)
    return record_key(event, attributes)


def _optional_text(spec: Mapping[str, Any], name: str) -> str | None:
    value = spec.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidEvent(f"{name} must be a string, got {type(value).__name__}")
    return value


def publish_all(publisher: MessagePublisher, specs: Sequence[Mapping[str, Any]], out: TextIO,
                err: TextIO | None = None) -> list[str]:
    """Publish every spec, reporting each; return the keys of those published."""
    err = err or sys.stderr
    keys: list[str] = []
    in_a_row = 0
    for number, spec in enumerate(specs, 1):
        try:
            keys.append(publish_spec(publisher, spec))
            in_a_row = 0
            print(f"  #{number}: {spec.get('event_type', 'raw')} {keys[-1]}", file=out)
        except EventBusError as exc:
            print(f"eventbus: event #{number} not published: {exc}", file=err)
            # An event refused before sending (EventTooLarge is a PublishError too) says
            # nothing about Pub/Sub.
            down = isinstance(exc, PublishError) and not isinstance(exc, InvalidEvent)
            in_a_row = in_a_row + 1 if down else 0
            if in_a_row >= MAX_FAILURES_IN_A_ROW:
                print(f"eventbus: {in_a_row} publish failures in a row; "
                      f"events #{number + 1}-#{len(specs)} not tried", file=err)
                break
        _progress(number, len(specs), len(keys), err)
    return keys


def _progress(done: int, total: int, published: int, err: TextIO) -> None:
    if total > PROGRESS_EVERY and (done % PROGRESS_EVERY == 0 or done == total):
        print(f"eventbus: {done}/{total} done, {published} published", file=err, flush=True)
