"""The reference model: what must be true of the store and the handlers, whatever happened.

The world (``tests.model.world``) tells the ledger what it sees happen: a
claim or a hold that a store call returned, a handler that started or ended,
a guarded effect that went out, a partner call refused, an answer given.
The ledger keeps what the promise implies and records a **violation** the
moment one of these no longer holds:

* **no guarded effect twice per key** (``DuplicateEffect``), except where
  nothing can fence it: an effect on the wire when its process was frozen
  past its lease or died before its result was stored (DESIGN.md, "Time,
  leases and fencing");
* **a healthy instance keeps what it holds** (``LeaseTaken``): while an
  instance that is neither frozen nor dead runs an event, no other instance
  claims it, holds its entity, redrives it or gives it up;
* **one handler of an entity at a time** (``EntityOverlap``), and **never
  an older position after a newer SUCCESS** (``OrderBroken``): no handler
  starts below a SUCCESS of its entity, SUCCESSes come in position order,
  and the stored position never moves back;
* **the processor classifies everything** (``Escaped``): ``run`` never
  raises for a message;
* **attempts and redrives bounded, parks never counted** (``Miscounted``):
  at most ``max_attempts`` real runs (per replay), and an event given up
  for its attempt or redrive cap really spent them;
* **shared rate and breaker on one clock** (``PartnerClock``): a partner
  call refused by the rate or the breaker has a cause on the store's clock
  within the window, and no window lets through more than the rate allows;
* **nothing lost** (``Lost``): an acked message has a record, and after
  the world settles nothing is PROCESSING or PENDING, and every retryable
  record has a redrive due (checked by ``World.settle``).

Each family is its own exception class, so hypothesis reports (and shrinks)
each kind of failure on its own instead of the first one hiding the others.
Only protocol-level facts are used (store calls' return values, processor
results, records' documented statuses), so the checks survive a change of
the documents' inner shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from eventbus.model.outcome import Outcome
from eventbus.settings import Settings


class Violation(AssertionError):
    """A promise the reference model holds was broken (the base of every family)."""


class DuplicateEffect(Violation):
    """A guarded effect ran twice for one key."""


class LeaseTaken(Violation):
    """A lease or hold of a healthy instance was taken, redriven or given up by another."""


class EntityOverlap(Violation):
    """Two handlers of one entity ran at once."""


class OrderBroken(Violation):
    """An older position ran or was stored after a newer SUCCESS, or the position went back."""


class Escaped(Violation):
    """Something the processor should have classified escaped ``Processor.run``."""


class Miscounted(Violation):
    """Attempts or redrives went past their cap, or a cap was reached by parks."""


class PartnerClock(Violation):
    """A partner's shared rate or breaker refused or admitted calls on the wrong clock."""


class Lost(Violation):
    """A message was acked without a record, or a record was left where nothing finishes it."""


@dataclasses.dataclass(eq=False)
class Held:
    """A claim (on an event) or a hold (on an entity) an instance took, as a store call said."""

    key: str
    owner: str
    slot: int
    thread: int
    excused: bool = False
    """The instance was frozen or died since: what it holds may lapse legitimately."""


@dataclasses.dataclass(eq=False)
class HandlerRun:
    """One handler call, from its start to its end."""

    key: str
    slot: int
    entity: str = ""
    position: int | None = None
    excused: bool = False
    parked: bool = False
    active: bool = True


@dataclasses.dataclass(eq=False)
class Invocation:
    """One guarded effect that went out (a partner call on the wire)."""

    guard: str
    partner: str
    slot: int
    at: datetime
    state: str = "flight"
    """``flight`` while it runs, then ``ok`` or ``raised``."""
    excused: bool = False
    recorded: bool = False
    """Its success was stored by ``guard_finish`` (a crash before it leaves it unrecorded)."""


@dataclasses.dataclass
class Counts:
    """What one key spent since it was created or last replayed."""

    claims: int = 0
    """Claims a store call took (``claim_many``'s ``taken``)."""
    parks: int = 0
    """Answers PARKED: the partner was not called; no attempt spent."""
    unclaims: int = 0
    """Answers IN_PROGRESS to a claim the run had taken: the claim was given back."""
    runs: int = 0
    """Handler runs that did not end parked."""
    redrives: int = 0
    """Redrives counted by a store call while the record was not parked (nor PENDING)."""
    handed_back_redrives: int = 0
    """Redrives of the record while PENDING (handed back for a busy entity)."""

    @property
    def spent(self) -> int:
        """Attempts really spent: claims that were neither parks nor given back."""
        return self.claims - self.parks - self.unclaims


class Ledger:
    """What must be true, fed by the world as things happen; ``raise_first`` raises a violation."""

    def __init__(self, settings: Settings, *, rate_window: float, rate_limit: int,
                 breaker_window: float, rated: Iterable[str], slack: float = 0.0) -> None:
        self.settings = settings
        self.slack = slack
        """How far the store's decisions may lie from the world's reading of its clock."""
        self.rate_window, self.rate_limit = rate_window, rate_limit
        self.breaker_window = breaker_window
        self.rated = frozenset(rated)
        self.violations: list[Violation] = []
        self.claims: dict[str, list[Held]] = defaultdict(list)
        self.holds: dict[str, list[Held]] = defaultdict(list)
        self.runs: list[HandlerRun] = []
        self.invocations: dict[str, list[Invocation]] = defaultdict(list)
        self.calls: dict[str, list[datetime]] = defaultdict(list)
        """Partner → when each effect went out (store clock)."""
        self.causes: dict[str, list[datetime]] = defaultdict(list)
        """Partner → when an effect failed transiently or a call was refused by the rate."""
        self.deaths: list[datetime] = []
        """When instances died: a dead one may have spent a window's call or taken a probe."""
        self.counts: dict[str, Counts] = defaultdict(Counts)
        self.ordered: dict[str, tuple[str, int]] = {}
        """Event key → (entity key, position), for every ordered event created."""
        self.acked: set[str] = set()
        self._unchecked: set[str] = set()
        self._succeeded: dict[str, set[str]] = defaultdict(set)
        """Entity → keys of its events seen SUCCESS (not stale)."""
        self._top: dict[str, tuple[int, str]] = {}
        """Entity → the highest position seen SUCCESS (not stale), and its key."""
        self._positions: dict[str, Any] = {}
        self._capped: set[str] = set()
        """Keys whose current failure was checked against its cap (until their next claim)."""

    # -- recording -------------------------------------------------------------------
    def violate(self, family: type[Violation], text: str) -> None:
        """Record a broken promise; ``raise_first`` raises the first of its family."""
        self.violations.append(family(text))

    def claimed(self, key: str, owner: str, slot: int, thread: int, healthy: bool) -> None:
        """A store call took ``key`` for ``owner`` on instance ``slot``."""
        self.counts[key].claims += 1
        self._capped.discard(key)  # its next failure is a new one, to be checked
        for other in self._healthy(self.claims[key], owner):
            self.violate(LeaseTaken, f"{key} was claimed by instance {slot} while "
                                     f"{_who(other, slot)}, healthy, still ran it under its "
                                     "lease")
        self.claims[key].append(Held(key, owner, slot, thread, excused=not healthy))

    def held(self, entity: str, owner: str, slot: int, thread: int, healthy: bool) -> None:
        """A store call held ``entity`` for ``owner`` on instance ``slot``."""
        for other in self._healthy(self.holds[entity], owner):
            self.violate(LeaseTaken, f"entity {entity} was taken by instance {slot} while "
                                     f"{_who(other, slot)}, healthy, still held it")
        self.holds[entity].append(Held(entity, owner, slot, thread, excused=not healthy))

    def let_go(self, key: str, owner: str, *, entity: bool = False) -> None:
        """A finish or a release gave back what ``owner`` held of ``key``."""
        table = self.holds if entity else self.claims
        table[key] = [held for held in table[key] if held.owner != owner]

    def run_over(self, slot: int, thread: int) -> None:
        """A processing run ended: whatever it still held is no longer held by anyone alive."""
        for table in (self.claims, self.holds):
            for key in list(table):
                table[key] = [held for held in table[key]
                              if not (held.slot == slot and held.thread == thread)]

    def touched(self, key: str, slot: int, action: str) -> None:
        """A sweeper ``action`` (``redrove``, ``gave up``) changed ``key`` on instance ``slot``."""
        for other in self._healthy(self.claims[key], owner=""):
            self.violate(LeaseTaken, f"instance {slot}'s sweeper {action} {key} while instance "
                                     f"{other.slot}, healthy, was running it")

    def redriven(self, key: str, status: str, parked: bool) -> None:
        """A redrive of ``key`` was counted; one of a parked record spends nothing.

        One of a record handed back (PENDING) is counted apart: whether it
        spends a redrive is the store's choice, so it bounds neither way.
        """
        counts = self.counts[key]
        if status == "PENDING":
            counts.handed_back_redrives += 1
            return
        if parked:
            return
        counts.redrives += 1
        if counts.redrives > self.settings.redrive_max:
            self.violate(Miscounted, f"{key} was redriven {counts.redrives} times "
                                     f"(redrive_max {self.settings.redrive_max})")

    def replayed(self, key: str) -> None:
        """An operator reopened ``key``: a replay grants a fresh set of attempts (not redrives)."""
        before = self.counts[key]
        self.counts[key] = Counts(redrives=before.redrives,
                                  handed_back_redrives=before.handed_back_redrives)
        self._capped.add(key)  # the error it keeps until its next claim was checked already

    def frozen(self, slot: int) -> None:
        """Instance ``slot`` stops (a GC pause, a stopped VM): what it has may lapse."""
        self._excuse(slot, unrecorded_only=False)

    def died(self, slot: int, at: datetime) -> None:
        """Instance ``slot`` died: its claims lapse, and an unrecorded effect may be redone."""
        self.deaths.append(at)
        self._excuse(slot, unrecorded_only=True)

    def _excuse(self, slot: int, *, unrecorded_only: bool) -> None:
        for table in (self.claims, self.holds):
            for held in (held for helds in table.values() for held in helds):
                held.excused |= held.slot == slot
        for run in self.runs:
            run.excused |= run.slot == slot and run.active
        for invocation in (i for invs in self.invocations.values() for i in invs):
            if invocation.slot != slot:
                continue
            if invocation.state == "flight" or (unrecorded_only and not invocation.recorded):
                invocation.excused = True

    def run_started(self, run: HandlerRun,
                    records: Callable[[list[str]], Sequence[Mapping[str, Any]]]) -> None:
        """A handler starts: one per entity at a time, never below its entity's SUCCESS."""
        self.runs = [other for other in self.runs if other.active]
        if run.entity:
            for other in self.runs:
                if other.entity == run.entity and not other.excused:
                    self.violate(EntityOverlap, f"{run.key} (position {run.position}) started on "
                                                f"instance {run.slot} while {other.key} "
                                                f"(position {other.position}) ran on instance "
                                                f"{other.slot}")
            self._not_below(run, records)
        self.runs.append(run)

    def _not_below(self, run: HandlerRun,
                   records: Callable[[list[str]], Sequence[Mapping[str, Any]]]) -> None:
        keys = [key for key, (entity, _) in self.ordered.items() if entity == run.entity]
        for record in records(keys):
            key = str(record.get("idempotency_key"))
            position = self.ordered[key][1]
            if _applied(record) and run.position is not None and position > run.position:
                self.violate(OrderBroken, f"{run.key} (position {run.position}) started on "
                                          f"instance {run.slot} after {key} (position "
                                          f"{position}) had succeeded")

    def run_ended(self, run: HandlerRun) -> None:
        """A handler returned or raised; a run that did not park spends an attempt."""
        run.active = False
        if run.parked:
            return
        counts = self.counts[run.key]
        counts.runs += 1
        if counts.runs > self.settings.max_attempts:
            self.violate(Miscounted, f"{run.key}'s handler ran {counts.runs} times "
                                     f"(max_attempts {self.settings.max_attempts})")

    def invoked(self, invocation: Invocation) -> None:
        """A guarded effect goes out: never twice per key, and within the partner's rate."""
        for earlier in self.invocations[invocation.guard]:
            if not earlier.excused and earlier.state in ("flight", "ok"):
                self.violate(DuplicateEffect,
                             f"guarded effect {invocation.guard} went out on instance "
                             f"{invocation.slot} while an earlier one (instance {earlier.slot}, "
                             f"at {earlier.at:%H:%M:%S}) was {earlier.state}")
        self.invocations[invocation.guard].append(invocation)
        if invocation.partner in self.rated:
            self._within_rate(invocation.partner, invocation.at)
        self.calls[invocation.partner].append(invocation.at)

    def _within_rate(self, partner: str, at: datetime) -> None:
        # Any interval holds at most (windows it spans + 1) windows' worth of calls: what a
        # fixed window on one clock lets through at a boundary, or a token bucket of one
        # window's capacity. Calls counted on two clocks go past it.
        times = sorted([*self.calls[partner], at])
        for index, start in enumerate(times):
            span = (at - start).total_seconds()
            inside = sum(1 for moment in times[index:] if moment <= at)
            allowed = self.rate_limit * (math.floor(span / self.rate_window) + 2)
            if inside > allowed:
                self.violate(PartnerClock, f"{inside} calls to {partner} within {span:g} s of "
                                           f"the store's clock (rate allows {allowed})")
                return

    def effect_ended(self, invocation: Invocation, state: str, at: datetime,
                     transient: bool = False) -> None:
        """The effect returned (``ok``) or raised; a transient failure counts for the breaker."""
        invocation.state = state
        if transient:
            self.causes[invocation.partner].append(at)

    def recorded(self, guard: str) -> None:
        """``guard_finish`` stored the success of ``guard``'s latest effect."""
        for invocation in reversed(self.invocations[guard]):
            if invocation.state == "ok" and not invocation.recorded:
                invocation.recorded = True
                return

    def refused(self, partner: str, kind: str, at: datetime) -> None:
        """A partner call was refused (``rate`` or ``breaker``): it must have a recent cause.

        A rate refusal needs a window's worth of calls in the last window (a
        dead instance may have spent one unseen); a breaker refusal needs a
        failure, a call (its probe), a rate refusal (of its probe) or a death
        (with its probe) within the breaker's window. On one clock a refusal
        always has one; counted on another instance's clock it may have none.
        """
        if kind == "rate":
            window, causes = self.rate_window, [*self.calls[partner], *self.deaths]
            needed = self.rate_limit
        else:
            window, needed = self.breaker_window, 1
            causes = [*self.calls[partner], *self.causes[partner], *self.deaths]
        # On a real server the decision's own time is a few ms off the world's reading.
        recent = [t for t in causes
                  if -self.slack <= (at - t).total_seconds() < window + self.slack]
        if len(recent) < needed:
            self.violate(PartnerClock, f"a call to {partner} was refused by its {kind} at "
                                       f"{at:%H:%M:%S} with {len(recent)} calls or failures in "
                                       f"the last {window:g} s of the store's clock")
        if kind == "rate":
            self.causes[partner].append(at)

    def answered(self, key: str, outcome: Outcome, claimed: bool) -> None:
        """The processor answered ``key``; parks and given-back claims spend no attempt."""
        if outcome is Outcome.PARKED:
            self.counts[key].parks += 1
        elif outcome is Outcome.IN_PROGRESS and claimed:
            self.counts[key].unclaims += 1
        if outcome.acked and key:
            self.acked.add(key)
            self._unchecked.add(key)

    # -- checking --------------------------------------------------------------------
    def observe(self, records: Mapping[str, Mapping[str, Any]],
                entities: Mapping[str, Mapping[str, Any]]) -> None:
        """Check what the store holds now (after a step) against what must be true."""
        for key in sorted(self._unchecked):
            if key not in records:
                self.violate(Lost, f"{key} was acked but has no record")
        self._unchecked.clear()
        self._in_order(records)
        self._caps(records)
        for entity, record in entities.items():
            position = record.get("position")
            before = self._positions.get(entity)
            if before is not None and position is not None and position < before:
                self.violate(OrderBroken, f"entity {entity}'s stored position went back from "
                                          f"{before} to {position}")
            if position is not None:
                self._positions[entity] = position

    def _in_order(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        fresh: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for key, (entity, position) in self.ordered.items():
            record = records.get(key)
            if record is not None and _applied(record) and key not in self._succeeded[entity]:
                fresh[entity].append((position, key))
        for entity, news in fresh.items():
            top = self._top.get(entity)
            for position, key in sorted(news):
                if top is not None and position < top[0]:
                    self.violate(OrderBroken, f"{key} (position {position}) succeeded after "
                                              f"{top[1]} (position {top[0]}) had")
                self._succeeded[entity].add(key)
            best = max(news)
            if top is None or best[0] > top[0]:
                self._top[entity] = best

    def _caps(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        for key, record in records.items():
            error = record.get("error")
            if key in self._capped or record.get("event_status") != "FAILED" or \
                    not isinstance(error, Mapping):
                continue
            counts = self.counts[key]
            if error.get("type") == "AttemptCapReached" or \
                    error.get("classification") == "attempt_cap":
                self._capped.add(key)
                # No claim seen means the claims went by a store call the world does not
                # watch: nothing to judge the cap by.
                if counts.claims and counts.spent < self.settings.max_attempts:
                    self.violate(Miscounted, f"{key} was given up at its attempt cap "
                                             f"({self.settings.max_attempts}) after {counts.spent} "
                                             f"real attempts ({counts.claims} claims, "
                                             f"{counts.parks} parks, {counts.unclaims} given back)")
            elif error.get("classification") == "redrive_cap":
                self._capped.add(key)
                spent = counts.redrives + counts.handed_back_redrives
                if spent < self.settings.redrive_max:
                    self.violate(Miscounted, f"{key} was given up at its redrive cap "
                                             f"({self.settings.redrive_max}) after {spent} "
                                             "redrives of it unparked")

    def raise_first(self) -> None:
        """Raise the first violation recorded (its family is the exception's class)."""
        if self.violations:
            first = self.violations[0]
            same = [str(v) for v in self.violations if type(v) is type(first)]
            raise type(first)("\n".join(dict.fromkeys(same)))

    def _healthy(self, helds: list[Held], owner: str) -> list[Held]:
        return [held for held in helds if not held.excused and held.owner != owner]


def _who(other: Held, slot: int) -> str:
    """Name the holder: another instance, or another run of the same one."""
    return f"another run of instance {slot}" if other.slot == slot else f"instance {other.slot}"


def _applied(record: Mapping[str, Any]) -> bool:
    """True for a SUCCESS that applied its event (not one stored as stale)."""
    return record.get("event_status") == "SUCCESS" and not record.get("stale")
