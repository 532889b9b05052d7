"""Partners for operators: each breaker, its parked events and rate; opening and closing by hand.

A view shows why the breaker last opened (``reason``: failures or slow calls,
with the numbers), the slow calls counted on it (every instance's: they are
stored), the bulkhead's cap, and the calls in flight **of this process** when
the view is made inside a service (the console mounted in it: ``local``);
elsewhere (``eventbus partners``, a console of its own) they are unknown
(None), since each process keeps its own bulkhead.

``views`` is what ``eventbus partners`` and the console's partners page show,
each partner under its stored name (``eventbus.partners.call.partner_name``).
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

from eventbus.partners.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerState,
    describe_reason,
    forced,
    partner_name,
    swap,
)
from eventbus.partners.call import Partners
from eventbus.partners.store import PartnerStore
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
    reason: str = ""
    """Why the breaker last opened, in words with its numbers (empty: never opened)."""
    opened_at: datetime | None = None
    slow_calls: int = 0
    """Slow calls counted on the breaker since it last closed (every instance's)."""
    last_slow_at: datetime | None = None
    last_slow_seconds: float = 0.0
    concurrency: int = 0
    """The bulkhead: calls in flight allowed per process (0: no cap)."""
    in_flight: int | None = None
    """This process's calls in flight now; None when the view is made outside the service."""

    def to_json(self) -> dict[str, Any]:
        """Return the view as plain data."""
        return dataclasses.asdict(self)


def views(store: PartnerStore, settings: Settings, now: datetime,
          local: Partners | None = None) -> list[PartnerView]:
    """Return every partner with a breaker, parked events, a rate or a cap of its own, by name.

    ``local``: the service's own ``Partners`` (the console mounted in it), whose
    calls in flight are shown, and whose partners with calls in flight are listed.
    """
    breakers = {str(doc["name"]): BreakerState.from_document(doc) for doc in store.breakers()}
    parked = store.parked_counts()
    group = local or Partners(store, settings)
    flying = local.in_flight() if local is not None else {}
    names = sorted({*breakers, *parked, *group.rates, *group.concurrencies,
                    *(name for name, n in flying.items() if n)})
    return [_view(name, breakers.get(name, BreakerState()), parked.get(name, 0), group, now,
                  flying.get(name, 0) if local is not None else None) for name in names]


def _view(name: str, state: BreakerState, parked: int, group: Partners, now: datetime,
          in_flight: int | None) -> PartnerView:
    kind, until, label = describe(state, now)
    return PartnerView(name, kind, label, until, state.failures, state.last_error,
                       state.last_failure_at, parked, group.rate(name), state.audit,
                       describe_reason(state.reason), state.opened_at, state.slow_calls,
                       state.last_slow_at, state.last_slow_seconds, group.concurrency(name),
                       in_flight)


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


def stored_name(store: PartnerStore, name: str, settings: Settings | None = None) -> str:
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


def steer(store: PartnerStore, name: str, *, hold_open: bool, why: str, by: str,
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
