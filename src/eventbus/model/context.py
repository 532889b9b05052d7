"""What a handler receives: the event, its key, the attempt, a logger, ``emit`` and a guard."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventbus.model import content
from eventbus.model.delivery import Delivery
from eventbus.model.errors import InvalidEvent
from eventbus.model.event import EntityMetadata, Event, event_from_document
from eventbus.model.keys import canonical_json, child_key, fingerprint_text
from eventbus.model.rebuild_policy import Replay
from eventbus.model.status import Status

if TYPE_CHECKING:  # types only: the model never calls into the guard's layer
    from eventbus.guard import Guard
    from eventbus.partners import Partner, Partners


class ChildEntry(dict[str, Any]):
    """An outbox entry as stored, carrying in memory the child's JSON text (``text``).

    The inline relay publishes ``text`` as it is; an entry read back from the
    store (the sweeper's) has none, and the relay serialises its fields again.
    """

    __slots__ = ("text",)

    def __init__(self, fields: Mapping[str, Any], text: str = "") -> None:
        super().__init__(fields)
        self.text = text


@dataclasses.dataclass(frozen=True)
class Child:
    """An event emitted by a handler, published by the relay after the parent succeeds.

    ``text`` is the event's canonical JSON, made once when it is emitted;
    ``fingerprint`` is its hash. Both are derived from ``event`` when not given.
    """

    key: str
    event: Event
    ordering_key: str = ""
    text: str = ""
    fingerprint: str = ""

    def __post_init__(self) -> None:
        """Serialise the event once, when the emitter did not."""
        if not self.text:
            object.__setattr__(self, "text", canonical_json(self.event.to_document()))
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint_text(self.text))

    def to_document(self, parent_key: str, root_key: str, created_at: datetime) -> ChildEntry:
        """Return the outbox entry stored in the parent's document.

        ``created_at`` lets the sweeper leave young entries to the inline relay.
        """
        return ChildEntry({"idempotency_key": self.key, **self.event.to_document(),
                            "ordering_key": self.ordering_key, "parent_key": parent_key,
                            "root_key": root_key, "status": Status.PENDING.value,
                            "publish_attempts": 0, "payload_fingerprint": self.fingerprint,
                            "created_at": created_at}, self.text)


@dataclasses.dataclass
class Context:
    """Passed to every handler.

    ``db`` is the database for the handler's own effects (the store's, or
    what a test gave); ``guard`` runs a side effect the store cannot undo
    (an HTTP call) at most once per key; ``partner(name)`` is the partner's
    breaker and shared rate, for outbound calls.
    """

    event: Event
    key: str
    attempt: int
    delivery: Delivery
    log: logging.LoggerAdapter[logging.Logger]
    db: Any
    now: Callable[[], datetime]
    guard: Guard
    root_key: str = ""
    children: list[Child] = dataclasses.field(default_factory=list)
    partners: Partners | None = None
    """The processor's partners (``eventbus.partners``); ``partner`` reads it."""
    replay: Replay | None = None
    """Set when an operator's rebuild runs the handler again (``eventbus.model.rebuild_policy``):
    who, why, when; None on a live delivery. A handler may branch on it."""

    def partner(self, name: str) -> Partner:
        """Return partner ``name``'s breaker and rate: ``context.partner(id).call(effect)``.

        While its breaker is open (or its rate spent) ``call`` raises
        ``BreakerOpen`` (``RateLimited``) and the event is parked, not retried.
        """
        if self.partners is None:
            raise RuntimeError("this processor has no partners: build it with eventbus.assembly "
                               "(create_app, create_worker, LocalBus) or pass partners=")
        return self.partners.get(name)

    def emit(self, event_type: str, data: Mapping[str, Any], *,
             entity: EntityMetadata | None = None, version: str = "v1",
             direction: str = "IN", ordering_key: str = "") -> str:
        """Queue a child event; it is stored with the parent's SUCCESS and published after.

        The child's key derives from this event's key, the child type and its
        index, so a retried handler emits the same keys. The child is checked
        with the receiver's own rules now, so a child that could never be
        processed fails its parent instead of the relay. Returns the key.
        """
        key = child_key(self.key, event_type, len(self.children))
        meta = entity or self.event.entity_metadata
        body = {"event_type": event_type, "event_version": version,
                "event_direction": direction, "entity_metadata": meta.to_document(),
                "entity_data": dict(data)}
        event = _validated(body)
        self.children.append(Child(key=key, event=event, ordering_key=ordering_key,
                                   text=_serialised(event)))
        return key


def _validated(body: Mapping[str, Any]) -> Event:
    # Checked once, here, with the receiver's rules: the relay publishes the
    # stored entry as it is, without parsing it back.
    try:
        found = content.problem(body)
        if found:
            raise InvalidEvent(f"its data cannot be stored: {found}")
        return event_from_document(body)
    except (InvalidEvent, TypeError, ValueError) as exc:
        raise _bad_emit(body["event_type"], exc) from exc


def _serialised(event: Event) -> str:
    # The child's one serialisation: its text is published, its hash stored.
    try:
        return canonical_json(event.to_document())
    except (TypeError, ValueError) as exc:
        raise _bad_emit(event.event_type, exc) from exc


def _bad_emit(event_type: object, exc: Exception) -> ValueError:
    # A bad emit is a bug in the handler: a transient error keeps the
    # parent retryable until a fixed handler is deployed.
    return ValueError(f"emit({event_type!r}) cannot be published: {exc}")
