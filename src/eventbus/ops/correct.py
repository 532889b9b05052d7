"""Edit and retry: a refused record's corrected event runs under the record's own key.

A record stored by rejection (an invalid payload under ``invalid:``, an unknown
type or version under its own key, a different payload recorded under
``conflict:``) never ran. The operator gives the corrected event (or, for a
conflict, applies the conflicting payload as it was stored); then:

1. the corrected event is validated as the receiver validates it, and refused
   when it would be refused there (unknown type, an internal step of a
   cascade) or would belong to another partner than the record;
2. the replay audit entry (``replays``) names its payload fingerprint: the
   message carries ``replay_of=<record key>``, and the receiver runs it under
   that key only because the audit lists that payload
   (``eventbus.processor.intake``), as a cascade child runs only when its
   parent lists it;
3. the claim takes the refused record (``documents.redoes``): the record then
   shows the corrected event, and the refusal, raw payload included, moves to
   its ``rejections``.

Records that ran (SUCCESS, in progress, or FAILED by their handler) are not
corrected: ``NotCorrectable``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import EventBusError, InvalidEvent
from eventbus.model.event import Event, json_object
from eventbus.model.keys import REPLAY_OF, canonical_json, fingerprint
from eventbus.model.status import Status
from eventbus.processor import Located
from eventbus.pubsub.message import build_event, message_attributes

REFUSED_PREFIXES = ("invalid:", "conflict:")


class NotCorrectable(EventBusError):
    """Raised when ``--data`` is given for a record that ran: one line, exit 2."""


@dataclasses.dataclass(frozen=True)
class Correction:
    """The message that runs a corrected event under a refused record's key, and its audit."""

    data: bytes
    attributes: dict[str, str]
    key: str
    audit: dict[str, Any]


def refused(record: Mapping[str, Any]) -> bool:
    """Return True for a record stored by rejection that no payload has taken since."""
    key = str(record.get("idempotency_key", ""))
    return record.get("event_status") == Status.FAILED and (
        record.get("rejected") is True or key.startswith(REFUSED_PREFIXES)) and \
        not record.get("attempts")


def check_correctable(record: Mapping[str, Any]) -> None:
    """Raise ``NotCorrectable`` (one line) unless ``record`` is a refused record."""
    if refused(record):
        return
    status = record.get("event_status") or "no status"
    why = "it ran and failed: replay it without --data" if status == Status.FAILED else \
        "it succeeded: nothing to correct" if status == Status.SUCCESS else \
        "it is being processed: wait for its outcome"
    raise NotCorrectable(f"--data corrects refused events only, and "
                         f"{record.get('idempotency_key')!r} is {status}: {why}")


def corrected_event(body: Mapping[str, Any]) -> Event:
    """Return the event ``body`` describes, validated as a publisher's event is."""
    try:
        return build_event(body.get("event_type", ""), body.get("entity_data", {}),
                           entity=body.get("entity_metadata", {}),
                           version=body.get("event_version", "v1"),
                           direction=body.get("event_direction", "IN"))
    except (InvalidEvent, AttributeError, TypeError) as exc:
        raise InvalidEvent(f"the corrected data is not a valid event: {exc}") from None


def stored_payload(record: Mapping[str, Any]) -> dict[str, Any]:
    """The payload a conflict record kept, to apply as stored; ``InvalidEvent`` if cut short."""
    raw = record.get("raw_payload")
    if not isinstance(raw, str) or len(raw) != record.get("payload_size", len(raw)):
        raise InvalidEvent("the conflicting payload was not stored whole: give it with --data")
    return json_object(raw.encode("utf-8", "surrogatepass"))


def correction(record: Mapping[str, Any], body: Mapping[str, Any],
               locate: Callable[[Delivery], Located]) -> Correction:
    """Return the message and audit data that run ``body`` under ``record``'s key."""
    check_correctable(record)
    event = corrected_event(body)
    _same_partner(record, event)
    data = canonical_json(event.to_document()).encode()
    plain = message_attributes(event.event_type, event.event_version, "")
    plain.pop("idempotency_key")
    located = locate(Delivery(data, plain, message_id="replay"))
    if located.error is not None:
        raise InvalidEvent(f"the corrected event would be refused: {located.error}")
    key = str(record["idempotency_key"])
    audit = {"corrected": True, "payload_fingerprint": fingerprint(event),
             "event_type": event.event_type, "refused_event_type": record.get("event_type"),
             "refused_payload_sha256": record.get("payload_sha256")}
    return Correction(data, {**plain, REPLAY_OF: key}, key, audit)


def _same_partner(record: Mapping[str, Any], event: Event) -> None:
    meta = record.get("entity_metadata")
    partner = meta.get("partnerId") if isinstance(meta, Mapping) else None
    if partner and partner != event.entity_metadata.partner_id:
        raise InvalidEvent(f"the corrected event is partner "
                           f"{event.entity_metadata.partner_id!r}'s, the record {partner!r}'s: "
                           "an event never moves to another partner's keys")
