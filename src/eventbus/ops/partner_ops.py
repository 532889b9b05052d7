"""Partners for operators: each breaker, its parked events and rate; opening and closing by hand.

``views`` is what ``eventbus partners`` and the console's partners page show,
each partner under its stored name (``eventbus.partners.partner_name``).
``steer`` holds a breaker open or closes it, audited like a replay: an entry
``{action, why, by, at}`` kept on the breaker (its last twenty) and a log
line. Closing by hand also makes the partner's parked events due for the
redrive at once. An operator names a partner as it is listed or as it is
raw (``stored_name``): both find the same breaker.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eventbus.partners import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerState,
    Partners,
    forced,
    partner_name,
    swap,
)
from eventbus.settings import Settings

logger = logging.getLogger("eventbus.ops")


class SteerError(Exception):
    """Raised when a breaker could not be changed (other instances kept changing it)."""


@dataclasses.dataclass(frozen=True)
class PartnerView:
    """One partner as an operator sees it."""

    name: str
    state: str
    """``closed``, ``open``, ``half_open`` or ``held_open`` (by an operator)."""
    label: str
    """The state in words: ``open until 12:00:30Z``, ``held open by ana: why``..."""
    until: datetime | None
    failures: int
    last_error: str
    last_failure_at: datetime | None
    parked: int
    rate: float
    """Calls per second allowed (0: no limit)."""
    audit: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the view as plain data."""
        return dataclasses.asdict(self)


def views(store: Any, settings: Settings, now: datetime) -> list[PartnerView]:
    """Return every partner with a breaker or parked events, by name."""
    breakers = {str(doc["name"]): BreakerState.from_document(doc) for doc in store.breakers()}
    parked = store.parked_counts()
    rates = Partners(store, settings)
    names = sorted({*breakers, *parked, *rates.rates})
    return [_view(name, breakers.get(name, BreakerState()), parked.get(name, 0),
                  rates.rate(name), now) for name in names]


def _view(name: str, state: BreakerState, parked: int, rate: float,
          now: datetime) -> PartnerView:
    kind, until, label = describe(state, now)
    return PartnerView(name, kind, label, until, state.failures, state.last_error,
                       state.last_failure_at, parked, rate, state.audit)


def describe(state: BreakerState, now: datetime) -> tuple[str, datetime | None, str]:
    """Return the state's kind, the time it changes and its words."""
    if state.manual is not None:
        return "held_open", None, f"held open by {state.manual.get('by')}: " \
                                  f"{state.manual.get('why')}"
    if state.state == OPEN and state.open_until is not None:
        due = "probe due" if state.open_until <= now else "until"
        return OPEN, state.open_until, f"open, {due} {state.open_until:%Y-%m-%d %H:%M:%S}Z"
    if state.state == HALF_OPEN:
        return HALF_OPEN, state.probe_until, "half-open: one probe out"
    return CLOSED, None, "closed"


def stored_name(store: Any, name: str, settings: Settings | None = None) -> str:
    """Return the stored name an operator means by ``name``: as listed, else as raw.

    A name that normalises to itself is both. Otherwise ``name`` is the
    listed one when something is stored under it (a breaker, parked events)
    or a rate is set for it, and the partner's raw name, normalised here
    once, when not. (A raw name that is also another partner's listed name,
    ``sha256:`` and 64 hex digits, finds the listed one.)
    """
    stored = partner_name(name)
    if stored == name:
        return name
    listed = store.breaker_get(name) is not None or name in store.parked_counts() or (
        settings is not None and name in Partners(store, settings).rates)
    return name if listed else stored


def steer(store: Any, name: str, *, hold_open: bool, why: str, by: str,
          now: datetime, settings: Settings | None = None) -> BreakerState:
    """Hold partner ``name``'s breaker open, or close it (and bring its parked events back).

    ``name`` is as listed or raw (``stored_name``; ``settings`` for the rates).
    """
    stored = stored_name(store, name, settings)
    after = swap(store, stored, lambda state: forced(state, now, hold_open=hold_open, why=why,
                                                     by=by))
    if after is None:
        raise SteerError(f"breaker {stored!r} kept changing; try again")
    action = "held open" if hold_open else "closed"
    logger.info("breaker %s %s by %s: %s", stored, action, by, why,
                extra={"partner": stored, "operator": by})
    if not hold_open:
        store.unpark(stored, now)
    return after
