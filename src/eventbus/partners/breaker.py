"""A partner's breaker: its stored state and the pure transitions over it, and its stored name.

``BreakerState`` is the stored document (``eventbus.partners.documents``);
``admit``, ``succeeded``, ``failed``, ``slowed``, ``recorded`` and ``forced``
move it, and ``swap`` writes the move back by compare-and-swap
(``PartnerStore.breaker_swap``): single-document writes, no transaction.
``partner_name`` is the name a partner is stored under. What the breaker
does for a call (when it opens, the probe, slow calls): ``eventbus.partners.call``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventbus.partners.slow_calls import SlowPolicy, Tally

if TYPE_CHECKING:
    from eventbus.partners.store import PartnerStore
    from eventbus.settings import Settings

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
    slow: SlowPolicy = dataclasses.field(default_factory=SlowPolicy)

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        """Read the breaker settings."""
        slow = SlowPolicy(settings.breaker_slow_seconds, settings.breaker_slow_share,
                          settings.breaker_slow_min_calls,
                          max(settings.breaker_slow_window, settings.breaker_slow_min_calls))
        return cls(settings.breaker_failures, settings.breaker_open_seconds,
                   max(settings.breaker_open_cap_seconds, settings.breaker_open_seconds),
                   settings.breaker_probe_seconds, slow)


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
    reason: Mapping[str, Any] | None = None
    """Why it last opened: ``{cause, ...numbers}`` (``failures``, ``slow calls``,
    ``failed probe``, ``slow probe``); kept after it closes, replaced at the next opening."""
    slow_calls: int = 0
    """Slow calls counted (every instance's) since it last closed."""
    last_slow_at: datetime | None = None
    last_slow_seconds: float = 0.0
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
        fields["reason"] = dict(self.reason) if self.reason is not None else None
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
    closing = state.state != CLOSED
    return dataclasses.replace(state, state=CLOSED, failures=0, open_until=None,
                               probe_until=None, open_seconds=0.0,
                               slow_calls=0 if closing else state.slow_calls)


def failed(state: BreakerState, now: datetime, policy: Policy, error: str) -> BreakerState:
    """The state after a transient failure: counted, and opened at the threshold or a probe."""
    counted = dataclasses.replace(state, failures=state.failures + 1, last_error=error[:300],
                                  last_failure_at=now)
    if state.manual is not None or state.state == OPEN:
        return counted  # held by hand, or a call admitted before it opened
    if state.state == HALF_OPEN:
        return opened_for(counted, now, _reopen_seconds(state, policy),
                       {"cause": "failed probe", "error": error[:300]})
    if counted.failures >= policy.failures:
        return opened_for(counted, now, policy.open_seconds,
                       {"cause": "failures", "failures": counted.failures,
                        "threshold": policy.failures})
    return counted


def slowed(state: BreakerState, now: datetime, policy: Policy, seconds: float,
           tally: Tally | None) -> BreakerState:
    """The state after a slow call: counted; opened when it was the probe or ``tally`` says so.

    ``tally`` is this process's window with the call in it (None: not counted there).
    """
    counted = dataclasses.replace(state, slow_calls=state.slow_calls + 1, last_slow_at=now,
                                  last_slow_seconds=round(seconds, 3))
    if state.manual is not None or state.state == OPEN:
        return counted
    if state.state == HALF_OPEN:
        return opened_for(counted, now, _reopen_seconds(state, policy),
                       {"cause": "slow probe", "seconds": round(seconds, 3),
                        "slow_seconds": policy.slow.seconds})
    if tally is not None and policy.slow.opens(tally):
        return opened_for(counted, now, policy.open_seconds, policy.slow.reason(tally))
    return counted


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    """How one call went, as its breaker counts it."""

    error: str | None = None
    """A transient failure's text; None: the partner answered (or refused for good)."""
    seconds: float = 0.0
    slow: bool = False
    tally: Tally | None = None
    """This process's window with this call in it (None: slow calls are not counted)."""
    pause: float | None = None
    """Seconds the partner asked every caller to wait (a 429's ``Retry-After``); None: none."""


def recorded(state: BreakerState, now: datetime, policy: Policy,
             outcome: CallOutcome) -> BreakerState | None:
    """The state after a call; None when nothing changes (a fast answer on a closed breaker)."""
    if outcome.pause is not None and state.manual is None:
        # The partner said when it takes calls again: open until then, whatever the count.
        counted = failed(state, now, policy, outcome.error or "asked to wait")
        return opened_for(counted, now, outcome.pause,
                          {"cause": "retry after", "seconds": round(outcome.pause, 3)})
    if outcome.error is not None:
        after = failed(state, now, policy, outcome.error)
        return slowed(after, now, policy, outcome.seconds, outcome.tally) if outcome.slow \
            else after
    if outcome.slow:
        # An answer: the consecutive failures end, but its slowness counts.
        return slowed(dataclasses.replace(state, failures=0), now, policy, outcome.seconds,
                      outcome.tally)
    return succeeded(state)


def _reopen_seconds(state: BreakerState, policy: Policy) -> float:
    """A failed (or slow) probe opens the breaker for twice its last time, up to the cap."""
    return min(policy.open_cap_seconds, max(policy.open_seconds, state.open_seconds * 2))


def opened_for(state: BreakerState, now: datetime, seconds: float,
            reason: Mapping[str, Any]) -> BreakerState:
    """Return ``state`` opened at ``now`` for ``seconds``, with why."""
    return dataclasses.replace(state, state=OPEN, open_seconds=seconds, opened_at=now,
                               open_until=now + timedelta(seconds=seconds), probe_until=None,
                               reason=dict(reason))


def forced(state: BreakerState, now: datetime, *, hold_open: bool, why: str,
           by: str) -> BreakerState:
    """The state after an operator opened (held) or closed the breaker by hand."""
    entry = {"action": "open" if hold_open else "close", "why": why, "by": by, "at": now}
    audit = (*state.audit, entry)[-_AUDIT_KEEP:]
    if hold_open:
        return dataclasses.replace(state, state=OPEN, manual=entry, open_until=None,
                                   probe_until=None, opened_at=now, audit=audit,
                                   reason={"cause": "held open", "by": by, "why": why})
    return dataclasses.replace(state, state=CLOSED, manual=None, failures=0, open_until=None,
                               probe_until=None, open_seconds=0.0, slow_calls=0, audit=audit)


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


def describe_reason(reason: Mapping[str, Any] | None) -> str:
    """Why a breaker opened, in words with its numbers (empty when it never opened)."""
    if not reason:
        return ""
    cause = str(reason.get("cause", ""))
    if cause == "failures":
        return f"{reason.get('failures')} failures in a row (threshold {reason.get('threshold')})"
    if cause == "slow calls":
        share = float(reason.get("share") or 0) * 100
        threshold = float(reason.get("threshold") or 0) * 100
        running = f", {reason['running']} of them still running" if reason.get("running") \
            else ""
        return (f"slow calls: {reason.get('slow')} of the last {reason.get('calls')} took "
                f">= {reason.get('slow_seconds')} s{running} ({share:.0f}%, "
                f"threshold {threshold:.0f}%)")
    if cause == "slow probe":
        return f"slow probe: {reason.get('seconds')} s (>= {reason.get('slow_seconds')} s)"
    if cause == "failed probe":
        # The error's full text is the breaker's ``last_error``; a reason stays one line.
        return f"failed probe: {str(reason.get('error'))[:60]}"
    if cause == "retry after":
        return f"the partner asked to wait {reason.get('seconds')} s (Retry-After)"
    if cause == "held open":
        return f"held open by {reason.get('by')}: {reason.get('why')}"
    return cause


def probe_taken(state: BreakerState, now: datetime, policy: Policy) -> BreakerState | None:
    """The probe taken on the state as it stands now; None if another instance took it."""
    decision, probing = admit(state, now, policy)
    return probing if decision.allowed else None
