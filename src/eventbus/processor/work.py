"""What the stages pass along: one ``Item`` per delivery of a batch, and its ``Result``.

An item starts with its delivery and gains, stage by stage, where it belongs
(``located``), the claim it took, the outcome waiting to be stored
(``finish``) and at last its ``result``. Middleware (``eventbus.processor.middleware``)
reads items and keeps its own state in ``notes``; no stage reads ``notes``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.processor.intake import Located
from eventbus.store.base import Claim, Finish


@dataclasses.dataclass
class Result:
    """What processing one delivery did, for the response and the request log."""

    outcome: Outcome
    key: str = ""
    event_type: str = ""
    attempt: int = 0
    error: str = ""
    children: int = 0


@dataclasses.dataclass
class Pending:
    """An outcome decided by the handler stage, stored by the finish stage.

    ``result`` is the answer once ``finish`` is stored; ``log`` is the line
    logged then (level, message), so nothing is logged for an outcome that
    another worker's lease overruled.
    """

    finish: Finish
    result: Result
    log: tuple[int, str] | None = None


@dataclasses.dataclass(eq=False)
class Item:
    """One delivery on its way through the stages."""

    delivery: Delivery
    request_id: str
    located: Located | None = None
    claim: Claim | None = None
    context: Context | None = None
    pending: Pending | None = None
    result: Result | None = None
    leader: Item | None = None
    """The first item of the batch with the same key: this one follows its outcome."""
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Middleware's own state for this item (spans, timers); the stages never read it."""

    @property
    def key(self) -> str:
        """The idempotency key the item was located under ("" before the locate stage)."""
        return self.located.key if self.located is not None else ""

    @property
    def event_type(self) -> str:
        """The event's type once parsed (routed or not), else ""."""
        event = self.located.event if self.located is not None else None
        return event.event_type if event is not None else ""

    @property
    def routed(self) -> bool:
        """True when the item has a route and a key it may be claimed under."""
        return self.located is not None and self.located.error is None

    @property
    def open(self) -> bool:
        """True while no stage has decided the item's result."""
        return self.result is None and self.leader is None

    def decide(self, result: Result) -> None:
        """Set the item's result (the last word of the stage that decided it)."""
        self.result = result


def log_pending(pending: Pending, logger: logging.Logger) -> None:
    """Log the line a pending outcome carries, now that it is stored."""
    if pending.log is not None:
        logger.log(*pending.log)
