"""What a handler receives: the event, its key, the attempt, a logger and ``emit``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from eventbus.config import Settings
from eventbus.envelope import Delivery
from eventbus.errors import InvalidEvent
from eventbus.event import EntityMetadata, Event, parse_event
from eventbus.keys import canonical_json, child_key

PENDING = "PENDING"
PUBLISHED = "PUBLISHED"


@dataclasses.dataclass(frozen=True)
class Child:
    """An event emitted by a handler, published by the relay after the parent succeeds."""

    key: str
    event: Event
    ordering_key: str = ""

    def to_document(self, parent_key: str, root_key: str, created_at: datetime) -> dict[str, Any]:
        """Return the outbox entry stored in the parent's document.

        ``created_at`` lets the sweeper leave young entries to the inline relay.
        """
        return {"idempotency_key": self.key, **self.event.to_document(),
                "ordering_key": self.ordering_key, "parent_key": parent_key,
                "root_key": root_key, "status": PENDING, "publish_attempts": 0,
                "created_at": created_at}


@dataclasses.dataclass
class Context:
    """Passed to every handler. ``db`` is the MongoDB database for the handler's own effects."""

    event: Event
    key: str
    attempt: int
    delivery: Delivery
    log: logging.LoggerAdapter[logging.Logger]
    db: Any
    now: Callable[[], datetime]
    root_key: str = ""
    children: list[Child] = dataclasses.field(default_factory=list)
    settings: Settings = dataclasses.field(default_factory=Settings)
    """The service's settings, for handlers that need configuration (a partner URL)."""

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
        self.children.append(Child(key=key, event=_validated(body), ordering_key=ordering_key))
        return key


def _validated(body: Mapping[str, Any]) -> Event:
    try:
        return parse_event(canonical_json(body).encode())
    except (InvalidEvent, TypeError, ValueError) as exc:
        # A bad emit is a bug in the handler: a transient error keeps the
        # parent retryable until a fixed handler is deployed.
        raise ValueError(f"emit({body['event_type']!r}) cannot be published: {exc}") from exc
