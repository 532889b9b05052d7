"""Intake: everything computed once per message before the claim, and whom to trust.

``Intake.locate(delivery)`` parses the event, checks that its content can be
stored, finds its route, computes its key and its cascade links, and builds
the fields its record gets; or says why the message can never run, and under
which key it is stored FAILED instead. The rules (``eventbus.model.keys``):

* a publisher's key is scoped by partner (``p:<partner>:<key>``);
* a message that claims to be a child (``parent_key`` attribute) is accepted
  only when the parent is SUCCESS and its outbox lists this child with this
  payload; its root is the parent's, whatever the attributes say;
* an internal route runs only for such a child;
* a message whose content no store keeps is stored under ``invalid:<hash>``
  in a bounded form, as is a payload that is not an event, or a forged child;
  the hash is of its bytes and the attributes read with them
  (``rejected_key``), so the same bytes again are the same record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from eventbus.model import content
from eventbus.model.delivery import Delivery
from eventbus.model.errors import ContentProblem, ForgedLink, InternalOnly, InvalidEvent
from eventbus.model.event import Event, parse_event
from eventbus.model.forward import is_forward
from eventbus.model.keys import (
    REPLAY_OF,
    canonical_json,
    cascade_links,
    fingerprint_text,
    record_key,
    rejected_key,
)
from eventbus.model.order import Ordering, ordering
from eventbus.model.router import Route, Router
from eventbus.model.status import Status
from eventbus.store import documents
from eventbus.store.base import ProcessorStore


@dataclasses.dataclass(frozen=True)
class Located:
    """Where a delivery belongs: its key and record fields, or why it can never run."""

    delivery: Delivery
    key: str
    fields: dict[str, Any]
    event: Event | None = None
    route: Route | None = None
    root_key: str = ""
    error: InvalidEvent | None = None
    """Set when the message is stored FAILED for good without running."""
    order: Ordering | None = None
    """The entity and position of an event whose handler is ordered (``ordered_by``)."""
    upcast: Event | None = None
    """The event as the handler reads it, when intake knows it already: an ordered
    route's, upcast to read its position, or one at a version the handler reads."""
    failure: Exception | None = None
    """What the route's own code raised here (an ordered route's upcaster or position
    read): the handle stage answers it as the handler's failure, without the handler."""

    @property
    def fingerprint(self) -> str:
        """The payload's fingerprint, as stored with its record."""
        return str(self.fields.get("payload_fingerprint") or self.fields.get("payload_sha256"))

    def handler_event(self) -> Event:
        """The event for the handler, upcast; raises what the route's code raised at intake.

        Called inside the handler's ``try`` (``Processor._context``), so every
        exception from route code is classified as the handler's own. The
        upcast made at intake is reused: the handler reads the very event
        whose position ordered it, and an upcaster runs once per delivery.
        """
        if self.failure is not None:
            raise self.failure
        if self.upcast is not None:
            return self.upcast
        assert self.route is not None and self.event is not None
        return self.route.upcast(self.event)


class Intake:
    """Locates deliveries for one router and store; reads the store only to check a child."""

    def __init__(self, store: ProcessorStore, router: Router) -> None:
        self.store, self.router = store, router

    def locate(self, delivery: Delivery) -> Located:
        """Return where ``delivery`` belongs; never raises for anything a message holds."""
        parsed: Event | None = None
        try:
            event, payload, made = _event(delivery)
            parsed = event
            key, root = self._key(event, delivery, payload)
        except InvalidEvent as exc:
            # Nothing it holds is trusted: not the key it asked for, nor its links
            # (the event itself is kept when it parsed: parsed once, not again).
            return _refused(delivery, parsed, exc)
        order: Ordering | None = None
        upcast: Event | None = None
        failure: Exception | None = None
        try:
            route = self._route(event, key, root)
            if route.ordered_by:
                order, upcast, failure = _ordered(route, route.ordered_by, event)
            elif event.event_version in route.versions:
                upcast = event  # read as it is: the handle stage calls no upcast
        except InternalOnly as exc:
            return _refused(delivery, event, exc)
        except InvalidEvent as exc:
            # An unknown type (or an ordered event without a position) keeps
            # its own key, so a replay after the fix finds it, and its
            # fingerprint, so a corrected event under that key is told apart.
            return _refused(delivery, event, exc, key, payload)
        fields = documents.event_fields(event, delivery, fingerprint=payload, made=made,
                                        **self._links(delivery, key, root))
        return Located(delivery, key, fields, event, route, root, order=order, upcast=upcast,
                       failure=failure)

    def _key(self, event: Event, delivery: Delivery, payload: str) -> tuple[str, str]:
        if REPLAY_OF in delivery.attributes:
            return self._replay_key(delivery.attributes[REPLAY_OF], payload)
        links = cascade_links(delivery.attributes)
        if "parent_key" in links or "parent_key" in delivery.attributes:
            return self._child_key(delivery, links.get("parent_key", ""), payload)
        key = record_key(event, delivery.attributes)
        return key, key

    def _route(self, event: Event, key: str, root: str) -> Route:
        route = self.router.route_for(event)
        if route.internal and root == key:
            raise InternalOnly(f"{event.event_type} is an internal step of a cascade; "
                               "it is accepted only from the relay")
        return route

    def _child_key(self, delivery: Delivery, parent_key: str, payload: str) -> tuple[str, str]:
        key = delivery.attributes.get("idempotency_key", "")
        parent = self.store.get(parent_key) if parent_key else None
        if _listed(parent, key, payload) is None:
            raise ForgedLink(f"no SUCCESS parent {parent_key!r} lists child {key!r} "
                             "with this payload")
        assert parent is not None
        return key, str(parent.get("root_key") or parent_key)

    def _replay_key(self, target: str, payload: str) -> tuple[str, str]:
        # An operator's corrected event runs under the refused record's own
        # key: only when that record's replay audit names this very payload.
        record = self.store.get(target) if target else None
        entries = (record or {}).get("replays") or []
        if not any(isinstance(entry, Mapping) and isinstance(entry.get("data"), Mapping)
                   and entry["data"].get("payload_fingerprint") == payload for entry in entries):
            raise ForgedLink(f"no operator replay of {target!r} lists this payload")
        assert record is not None
        return target, str(record.get("root_key") or target)

    @staticmethod
    def refuse(delivery: Delivery, event: Event | None) -> Located:
        """Return the bounded form of ``delivery`` under its ``invalid:`` key, unprocessed."""
        return _refused(delivery, event, ContentProblem("refused by the store"))

    @staticmethod
    def _links(delivery: Delivery, key: str, root: str) -> dict[str, str]:
        if root == key:
            return {}
        return {"parent_key": cascade_links(delivery.attributes)["parent_key"], "root_key": root}


def _event(delivery: Delivery) -> tuple[Event, str, tuple[dict[str, Any], dict[str, Any]]]:
    """Return the delivery's event, its fingerprint and its two documents, or raise
    ``InvalidEvent``.

    The event's canonical JSON is made once: for the fingerprint, and to
    prove most payloads storable without walking them. The event's and the
    delivery's documents it was made of become the record's fields.
    """
    if delivery.decode_error:
        raise InvalidEvent(delivery.decode_error)
    event = parse_event(delivery.data, delivery.attributes)
    document = event.to_document()
    pubsub = delivery.pubsub_document()
    text, pubsub_text = _canonical(document), _canonical(pubsub)
    quick = text + pubsub_text if text is not None and pubsub_text is not None else None
    found = content.problem({"event": document, "pubsub": pubsub}, quick)
    if found:
        raise ContentProblem(f"the message cannot be stored as it is: {found}")
    assert text is not None  # a document too deep to encode is never storable
    return event, fingerprint_text(text), (document, pubsub)


def _ordered(route: Route, path: str,
             event: Event) -> tuple[Ordering | None, Event | None, Exception | None]:
    """An ordered event's position, read as the handler reads the event: upcast.

    ``InvalidEvent`` (an unsupported version, no usable position) propagates:
    the event can never run. Anything else the route's code raises (a bug in
    the upcaster, or in what it returned) is kept as the failure the handle
    stage answers after the claim: classified as the handler's own, stored,
    bounded by the attempt cap. Such an event holds no entity: it never runs.
    """
    try:
        upcast = route.upcast(event)
        return ordering(upcast, path), upcast, None
    except InvalidEvent:
        raise
    except Exception as exc:  # whatever route code raises: see the docstring
        return None, None, exc


def _canonical(value: object) -> str | None:
    try:
        return canonical_json(value)
    except (RecursionError, ValueError):
        return None


def _listed(parent: Mapping[str, Any] | None, key: str,
            payload: str) -> Mapping[str, Any] | None:
    if parent is None or parent.get("event_status") != Status.SUCCESS:
        return None
    for entry in parent.get("outbox", []):
        if entry.get("idempotency_key") == key and not is_forward(entry) and \
                entry.get("payload_fingerprint") in (payload, None):
            return entry
    return None


def _refused(delivery: Delivery, event: Event | None, error: InvalidEvent,
             key: str = "", fingerprint: str = "") -> Located:
    # Without a key of its own, a message is stored under one derived from
    # its raw bytes and the attributes they are read with, not its message id:
    # a redelivery or a republish of the same bytes finds it (and counts one
    # more delivery), and nothing it holds is trusted.
    key = key or rejected_key(delivery.data, delivery.attributes,
                              undecodable=delivery.decode_error is not None)
    fields = documents.refused_fields(delivery, event)
    if fingerprint:
        fields["payload_fingerprint"] = fingerprint
    return Located(delivery, key, fields, event=event, error=error)
