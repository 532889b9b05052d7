"""Partners: a breaker and a shared rate each, kept in the store so every instance shares them.

A handler makes an outbound call through its partner::

    context.partner(partner_id).call(lambda: post(...))
    await context.partner(partner_id).call_async(lambda: client.post(...))   # async def


(the HTTP call itself on the library's client, ``eventbus.deadline.Client``,
so it ends within its deadline however the app wired its session).

* **Names.** ``Partners.get`` normalises a partner's id once
  (``partner_name``: an unusual one becomes ``sha256:<hex>``), and everything
  after it (the breaker, the bucket, parked events, the operator's views)
  uses that stored name as it is.
* **Breaker.** After ``Settings.breaker_failures`` consecutive transient
  failures the breaker opens for ``breaker_open_seconds``; then one call, the
  probe, goes through (half-open); its success closes the breaker, its failure
  opens it again for twice as long (up to ``breaker_open_cap_seconds``). A
  permanent failure (the partner answered, and refused) counts as an answer.
  An operator may hold a breaker open or close it by hand (``force``).
* **Rate.** ``Settings.partner_rate`` (or the partner's own, ``partner_rates``)
  calls per second, kept as one token bucket per partner in the store, so
  three instances share one quota: ``partner_burst_seconds``' worth of calls
  may go at once, then one per interval. Over any span ``T``, at most
  ``rate * T + burst`` calls go, wherever ``T`` starts (no window boundary to
  straddle). The store decides on its own clock, in one round trip
  (``EventStore.rate_take``), so instances whose clocks differ by minutes
  share it exactly. A call over it takes the next token and waits for it when
  that is at most ``partner_rate_wait_seconds`` away.
* **Parked.** A call the breaker or the rate does not let through raises
  ``BreakerOpen`` or ``RateLimited`` (``PartnerPaused``) with the time it may
  go through; the processor parks the event until then (stored, acked) and
  the store-driven redrive brings it back (all of them at once when a probe
  closes the breaker: ``EventStore.unpark``). The failure that opens the
  breaker, or fails its probe, raises ``BreakerOpen`` too (from the error), so
  the probing event waits with the others instead of spending its redrives.

State moves by pure functions (``admit``, ``succeeded``, ``failed``,
``forced``) over ``BreakerState``, written back by compare-and-swap
(``EventStore.breaker_swap``): single-document writes, no transaction.

**Async.** ``call_async`` is ``call`` for an async effect, with the same
breaker and rate decisions (the same pure functions over the same stored
state); its store calls go to a thread (``asyncio.to_thread``) and a wait for a
rate token is ``asyncio.sleep``, so the event loop never blocks on them.

**One clock.** Every time a breaker stores or compares (``opened_at``,
``open_until``, ``probe_until``, the ``until`` of ``BreakerOpen``) is the
store's (``store.now()``: the memory store's clock, MongoDB's server clock),
and every rate decision is the store's too; this process's clock only times
its own waits (``sleep``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from eventbus.model.errors import (
    BreakerOpen,
    Classification,
    Classifier,
    RateLimited,
    ReplayRefused,
)
from eventbus.settings import Settings
from eventbus.store.base import PartnerStore
from eventbus.store.documents.partner_documents import RateLimit

logger = logging.getLogger("eventbus.partners")

T = TypeVar("T")
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
MAX_NAME = 100
HASHED = "sha256:"
_SWAP_TRIES = 5
_AUDIT_KEEP = 20


def partner_name(name: object) -> str:
    """Return the name a partner's breaker is stored under.

    A printable name of at most ``MAX_NAME`` characters with no surrounding
    blanks (and not starting with ``sha256:``) is kept; anything else (NUL,
    lone surrogates, huge text, not a string) becomes ``sha256:`` and the hex
    hash of its UTF-8 bytes, so a hostile partner id is one safe key.
    """
    text = name if isinstance(name, str) else repr(name)
    if 0 < len(text) <= MAX_NAME and text.isprintable() and text == text.strip() \
            and not text.startswith(HASHED):
        return text
    return HASHED + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Policy:
    """When a breaker opens and for how long (from ``Settings``)."""

    failures: int = 5
    open_seconds: float = 30.0
    open_cap_seconds: float = 600.0
    probe_seconds: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        """Read the breaker settings."""
        return cls(settings.breaker_failures, settings.breaker_open_seconds,
                   max(settings.breaker_open_cap_seconds, settings.breaker_open_seconds),
                   settings.breaker_probe_seconds)


@dataclasses.dataclass(frozen=True)
class BreakerState:
    """One partner's breaker as stored (``version`` 0: nothing stored yet, closed)."""

    state: str = CLOSED
    failures: int = 0
    """Consecutive transient failures."""
    open_until: datetime | None = None
    """When an open breaker lets its probe through (None while held open by hand)."""
    open_seconds: float = 0.0
    """How long it opened for last; the next failed probe doubles it."""
    probe_until: datetime | None = None
    """Half-open: when the probe out now counts as lost and another may go."""
    manual: Mapping[str, Any] | None = None
    """Held open by an operator: ``{why, by, at}``; only an operator closes it."""
    last_error: str = ""
    last_failure_at: datetime | None = None
    opened_at: datetime | None = None
    audit: tuple[Mapping[str, Any], ...] = ()
    version: int = 0

    @classmethod
    def from_document(cls, document: Mapping[str, Any] | None) -> BreakerState:
        """Read a stored breaker document (None: a closed breaker never stored)."""
        if not document:
            return cls()
        names = {field.name for field in dataclasses.fields(cls)}
        values = {name: document[name] for name in names if name in document}
        values["audit"] = tuple(values.get("audit") or ())
        return cls(**values)

    def to_document(self) -> dict[str, Any]:
        """Return the fields stored (the store adds id, kind, name and version)."""
        fields = dataclasses.asdict(self)
        fields.pop("version")
        fields["audit"] = [dict(entry) for entry in self.audit]
        fields["manual"] = dict(self.manual) if self.manual is not None else None
        return fields


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``admit`` decided: a call goes through now, or not before ``until``."""

    allowed: bool
    until: datetime | None = None
    probe: bool = False
    why: str = ""


def admit(state: BreakerState, now: datetime,
          policy: Policy) -> tuple[Decision, BreakerState | None]:
    """Decide whether a call may go now; the state to store when it takes the probe."""
    if state.manual is not None:
        return Decision(False, now + timedelta(seconds=policy.open_seconds), why="held open"), None
    if state.state == CLOSED:
        return Decision(True), None
    if state.state == OPEN and state.open_until is not None and now < state.open_until:
        return Decision(False, state.open_until, why="open"), None
    if state.state == HALF_OPEN and state.probe_until is not None and now < state.probe_until:
        return Decision(False, state.probe_until, why="probe out"), None
    probing = dataclasses.replace(state, state=HALF_OPEN,
                                  probe_until=now + timedelta(seconds=policy.probe_seconds))
    return Decision(True, probe=True), probing


def succeeded(state: BreakerState) -> BreakerState | None:
    """The state after a call the partner answered; None when nothing changes."""
    if state.manual is not None or (state.state == CLOSED and state.failures == 0):
        return None
    return dataclasses.replace(state, state=CLOSED, failures=0, open_until=None,
                               probe_until=None, open_seconds=0.0)


def failed(state: BreakerState, now: datetime, policy: Policy, error: str) -> BreakerState:
    """The state after a transient failure: counted, and opened at the threshold or a probe."""
    counted = dataclasses.replace(state, failures=state.failures + 1, last_error=error[:300],
                                  last_failure_at=now)
    if state.manual is not None or state.state == OPEN:
        return counted  # held by hand, or a call admitted before it opened
    if state.state == HALF_OPEN:
        seconds = min(policy.open_cap_seconds, max(policy.open_seconds, state.open_seconds * 2))
    elif counted.failures >= policy.failures:
        seconds = policy.open_seconds
    else:
        return counted
    return dataclasses.replace(counted, state=OPEN, open_seconds=seconds, opened_at=now,
                               open_until=now + timedelta(seconds=seconds), probe_until=None)


def forced(state: BreakerState, now: datetime, *, hold_open: bool, why: str,
           by: str) -> BreakerState:
    """The state after an operator opened (held) or closed the breaker by hand."""
    entry = {"action": "open" if hold_open else "close", "why": why, "by": by, "at": now}
    audit = (*state.audit, entry)[-_AUDIT_KEEP:]
    if hold_open:
        return dataclasses.replace(state, state=OPEN, manual=entry, open_until=None,
                                   probe_until=None, opened_at=now, audit=audit)
    return dataclasses.replace(state, state=CLOSED, manual=None, failures=0, open_until=None,
                               probe_until=None, open_seconds=0.0, audit=audit)


def swap(store: PartnerStore, name: str, change: Callable[[BreakerState], BreakerState | None],
         seen: BreakerState | None = None) -> BreakerState | None:
    """Apply ``change`` to ``name``'s stored breaker by compare-and-swap; the state stored.

    Starts from ``seen`` when given (no read), reads again after a lost swap;
    None when ``change`` wanted nothing written, or every try was lost.
    """
    state = seen
    for _ in range(_SWAP_TRIES):
        if state is None:
            state = BreakerState.from_document(store.breaker_get(name))
        wanted = change(state)
        if wanted is None:
            return None
        if store.breaker_swap(name, state.version, wanted.to_document()):
            return dataclasses.replace(wanted, version=state.version + 1)
        state = None
    return None


class Partner:
    """One partner's breaker and rate; ``call`` runs an outbound call through both.

    Made by ``Partners.get``, which normalises the partner's name once:
    ``name`` is the stored name (``partner_name``'s result), kept as it is, so a
    hashed name is never hashed again.
    """

    def __init__(self, name: str, partners: Partners) -> None:
        self.name, self.partners = name, partners

    def call(self, effect: Callable[[], T]) -> T:
        """Run ``effect`` if the breaker and the rate let it; raise ``PartnerPaused`` if not.

        The effect's transient failure counts toward opening the breaker;
        its return (or a permanent failure: the partner answered) closes it.
        """
        self._refuse_replay()
        seen = self._admit()
        self.partners.pace(self.name)
        try:
            result = effect()
        except Exception as exc:
            after = self._after(seen, exc)
            if after is not None and after.state == OPEN and after.open_until is not None:
                # This failure opened it (or failed the probe): the event waits
                # for the next probe with the others instead of spending redrives.
                raise BreakerOpen(self.name, after.open_until, "opened by this call") from exc
            raise
        self._after(seen, None)
        return result

    async def call_async(self, effect: Callable[[], Awaitable[T]]) -> T:
        """``call`` for an async ``effect`` (awaited); the same breaker and rate rules.

        The store calls run in a thread and a wait for the rate is
        ``asyncio.sleep``, so nothing here blocks the event loop.
        """
        self._refuse_replay()
        seen = await asyncio.to_thread(self._admit)
        await self.partners.pace_async(self.name)
        try:
            result = await effect()
        except Exception as exc:
            after = await asyncio.to_thread(self._after, seen, exc)
            if after is not None and after.state == OPEN and after.open_until is not None:
                raise BreakerOpen(self.name, after.open_until, "opened by this call") from exc
            raise
        await asyncio.to_thread(self._after, seen, None)
        return result

    def _refuse_replay(self) -> None:
        if self.partners.refused:
            # Replay mode: a call outside the guard may have run before; see model.replay.
            raise ReplayRefused(f"partner call to {self.name!r} outside the guard: "
                                f"{self.partners.refused}")

    def _admit(self) -> BreakerState:
        store, policy = self.partners.store, self.partners.policy
        now = store.now()
        state = BreakerState.from_document(store.breaker_get(self.name))
        decision, probing = admit(state, now, policy)
        if decision.allowed and probing is None:
            return state
        if decision.allowed and probing is not None:
            taken = swap(store, self.name, lambda current: _probe(current, now, policy), state)
            if taken is not None:
                logger.info("breaker %s half-open: one probe goes through", self.name)
                return taken
            decision = Decision(False, now + timedelta(seconds=policy.probe_seconds),
                                why="probe taken elsewhere")
        assert decision.until is not None
        raise BreakerOpen(self.name, decision.until, decision.why)

    def _after(self, seen: BreakerState, exc: Exception | None) -> BreakerState | None:
        """Store how the call went; the state when this failure opened the breaker."""
        # The call happened: a store error here must not fail it (the guard
        # would call again), so the breaker's bookkeeping only logs.
        store, policy = self.partners.store, self.partners.policy
        now = store.now()
        answered = exc is None or self.partners.classifier.classify(exc) \
            is Classification.PERMANENT
        try:
            if answered:
                closed = swap(store, self.name, succeeded, seen)
                if closed is not None and seen.state != CLOSED:
                    # It answers again: what waited for it comes back at the next sweep,
                    # not at each event's own reopening time.
                    logger.info("breaker %s closed", self.name)
                    store.unpark(self.name, now)
                return None
            error = f"{type(exc).__name__}: {exc}"
            after = swap(store, self.name, lambda state: failed(state, now, policy, error), seen)
        except Exception:
            logger.exception("breaker %s: the outcome of a call was not stored", self.name)
            return None
        if after is None or after.state != OPEN or after.opened_at != now:
            return None
        logger.warning("breaker %s open until %s after %d failures", self.name,
                       after.open_until, after.failures)
        return after


def _probe(state: BreakerState, now: datetime, policy: Policy) -> BreakerState | None:
    """The probe taken on the state as it stands now; None if another instance took it."""
    decision, probing = admit(state, now, policy)
    return probing if decision.allowed else None


class Partners:
    """The partners of one processor: its store, classifier, settings and waits."""

    def __init__(self, store: PartnerStore, settings: Settings, *,
                 now: Callable[[], datetime] | None = None,
                 classifier: Classifier | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        """Decide every breaker and rate time on ``store.now()``, never on ``now``.

        ``now`` is this process's clock, only as the source of its waits:
        ``sleep`` defaults to ``now.sleep`` (a ``FakeClock``'s moves it), else
        ``time.sleep``.
        """
        self.store, self.settings = store, settings
        self.refused = ""
        """Set in replay mode without new calls: why ``Partner.call`` refuses."""
        self.policy = Policy.from_settings(settings)
        self.classifier = classifier or Classifier()
        self.sleep = sleep or getattr(now, "sleep", None) or time.sleep
        # Keyed by stored name, as every lookup is (``rate`` gets a ``Partner.name``).
        self.rates = {partner_name(name): rate for name, rate in settings.partner_rates}

    def get(self, name: object) -> Partner:
        """Return partner ``name`` (any text), under its stored name: the one normalisation."""
        return Partner(partner_name(name), self)

    def rate(self, name: str) -> float:
        """Calls per second allowed to the partner stored as ``name`` (0: no limit)."""
        return self.rates.get(name, self.settings.partner_rate)

    async def pace_async(self, name: str) -> None:
        """``pace`` for the event loop: the take in a thread, the wait an ``asyncio.sleep``.

        A fake clock's ``sleep`` (tests) is called as it is: it only moves the clock.
        """
        if self.rate(name) <= 0:
            return
        if self.sleep is not time.sleep:
            await asyncio.to_thread(self.pace, name)
            return
        waits: list[float] = []
        await asyncio.to_thread(self.pace, name, waits.append)
        if waits:
            await asyncio.sleep(waits[0])

    def pace(self, name: str, wait: Callable[[float], None] | None = None) -> None:
        """Take a token of ``name``'s shared bucket; wait briefly for it or raise ``RateLimited``.

        One round trip: the store reserves the next token when it is at most
        ``partner_rate_wait_seconds`` away (this call then sleeps until it),
        else takes nothing and answers when the next one is free, the
        ``until`` the event is parked to. ``wait`` replaces ``sleep`` for this call
        (``pace_async`` collects the wait and sleeps on the loop).
        """
        rate = self.rate(name)
        if rate <= 0:
            return
        limit = RateLimit.per_second(rate, self.settings.partner_burst_seconds)
        longest = timedelta(seconds=max(0.0, self.settings.partner_rate_wait_seconds))
        took = self.store.rate_take(name, limit, longest)
        if not took.taken:
            raise RateLimited(name, took.until, f"over {rate:g} calls/s")
        if took.wait > timedelta(0):
            (wait or self.sleep)(took.wait.total_seconds())
