"""What a handler receives: the event, its key, the attempt, a logger and ``emit``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from eventbus.envelope import Delivery
from eventbus.event import EntityMetadata, Event
from eventbus.keys import child_key


@dataclasses.dataclass(frozen=True)
class Child:
    """An event emitted by a handler, published by the relay after the parent succeeds."""

    key: str
    event: Event
    ordering_key: str = ""

    def to_document(self, parent_key: str, root_key: str) -> dict[str, Any]:
        """Return the outbox entry stored in the parent's document."""
        return {"idempotency_key": self.key, **self.event.to_document(),
                "ordering_key": self.ordering_key, "parent_key": parent_key,
                "root_key": root_key, "status": "PENDING", "publish_attempts": 0}


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

    def emit(self, event_type: str, data: Mapping[str, Any], *,
             entity: EntityMetadata | None = None, version: str = "v1",
             direction: str = "IN", ordering_key: str = "") -> str:
        """Queue a child event; it is stored with the parent's SUCCESS and published after.

        The child's key derives from this event's key, the child type and its
        index, so a retried handler emits the same keys. Returns the key.
        """
        key = child_key(self.key, event_type, len(self.children))
        child = Event(event_type=event_type, event_version=version, event_direction=direction,
                      entity_metadata=entity or self.event.entity_metadata,
                      entity_data=dict(data))
        self.children.append(Child(key=key, event=child, ordering_key=ordering_key))
        return key
