"""What the stages pass along: one ``Item`` per delivery of a batch, and its ``Result``.

An item starts with its delivery and gains, stage by stage, where it belongs
(``located``), the claim it took, the outcome waiting to be stored
(``finish``) and at last its ``result``. Middleware (``eventbus.processor.middleware``)
reads items and keeps its own state in ``notes``; no stage reads ``notes``.
Items are plain data (no properties), so the hot path runs no code here.
"""

from __future__ import annotations

import dataclasses
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
    detail: dict[str, Any] | None = None
    """What a rebuild did with the event (``eventbus.rebuild.mode``); None when live."""


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
    key: str = ""
    """The idempotency key the item was located under ("" before the locate stage)."""
    event_type: str = ""
    """The event's type once parsed (routed or not), else ""."""
    routed: bool = False
    """True when the item has a route and a key it may be claimed under."""
    claim: Claim | None = None
    context: Context | None = None
    pending: Pending | None = None
    result: Result | None = None
    leader: Item | None = None
    """The first item of the batch with the same key: this one follows its outcome."""
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Middleware's own state for this item (spans, timers); the stages never read it."""
