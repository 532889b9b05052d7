"""The simulation's reference ledger: what must hold, checked at every scheduling point.

The world tells the ledger what happens (a handler starts or ends, a guarded
effect goes out or returns, a projection is written, a store call returned);
``check()`` runs at every point (cheap: it reads only what changed) and
``final()`` once the run has settled. A broken promise raises a
``Violation`` subclass, its family:

* ``DuplicateEffect``: a guarded effect twice per key, except where nothing
  can fence it (its first run's process was paused past its lease or died
  before the result was stored: DESIGN.md, "Time, leases and fencing");
* ``EntityOverlap``: two handlers of one entity at once (a paused or dead
  instance's handler excused);
* ``OrderBroken``: an ordered handler started (live) below its entity's
  applied SUCCESS; a live projection write went back; at the end, an
  entity's projection is not its applied position (live or after a rebuild);
* ``Miscounted``: handler runs past ``max_attempts`` (per replay), redrives
  past ``redrive_max``;
* ``RebuildCalled``: a rebuild made a partner call without ``allow_new_calls``;
* ``ResumeLeft``: a resumed rebuild neither ran nor reported a key of its plan;
* ``Lost``: an acked message has no record; after settling, a record is
  PROCESSING or PENDING, or FAILED-retryable with no redrive due;
* ``Escaped``: ``Processor.run`` raised;
* ``TooEarly``: a deferred event (``RetryAfter``: stored FAILED-retryable with
  ``not_before``) claimed live before its ``not_before`` on the store's clock,
  whichever instance (clock) claimed it; a call to a partner admitted (sync)
  while the breaker it read was open, a partner-wide ``Retry-After`` included;
  a deferral that gave its attempt back is ``Miscounted``;
* ``ExpiryBroken``: ``max_age``, on the store's clock from the event's first
  publish time: a live claim past it ran the handler, or its event did not end
  stored ``expired`` (FAILED for good; or a stale SUCCESS, never run); an event
  stored ``expired`` that was not past it when stored (the verdict of a skewed
  clock); a rebuild that refused an event for its ``max_age``. An operator's
  replay (``record_replay`` with ``reopen``) chooses to run it, as a rebuild.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from eventbus.store.documents.parked import parks
from tests.sim.scheduler import Actor


class Violation(AssertionError):
    """A promise broken (the base of every family)."""


class DuplicateEffect(Violation):
    """A guarded effect ran twice for one key."""


class EntityOverlap(Violation):
    """Two handlers of one entity ran at once."""


class OrderBroken(Violation):
    """An older position ran or was applied after a newer SUCCESS."""


class Miscounted(Violation):
    """Attempts or redrives past their caps."""


class RebuildCalled(Violation):
    """A rebuild called a partner without ``allow_new_calls``."""


class ResumeLeft(Violation):
    """A resumed rebuild left keys of its run neither run nor reported."""


class Lost(Violation):
    """A message ended where nothing finishes it."""


class Escaped(Violation):
    """Something escaped ``Processor.run``."""


class TooEarly(Violation):
    """A deferred event claimed before its time, or a paused partner called."""


class ExpiryBroken(Violation):
    """An event past its route's ``max_age`` ran live or was not stored expired, or one
    was stored expired that was not past it."""


FAMILIES: tuple[type[Violation], ...] = (DuplicateEffect, EntityOverlap, OrderBroken, Miscounted,
                                         RebuildCalled, ResumeLeft, Lost, Escaped, TooEarly,
                                         ExpiryBroken)


@dataclasses.dataclass(eq=False)
class Run:
    """One handler call, start to end."""

    key: str
    actor: Actor
    entity: str
    position: int | None
    replay: bool
    active: bool = True
    excused: bool = False


@dataclasses.dataclass(eq=False)
class Effect:
    """One guarded effect on the wire."""

    guard: str
    actor: Actor
    state: str = "flight"
    excused: bool = False
    recorded: bool = False


class Ledger:
    """What must be true (see the module docstring)."""

    def __init__(self, *, max_attempts: int, redrive_max: int,
                 records: Callable[[Sequence[str]], list[Mapping[str, Any]]],
                 age_from: str = "delivery") -> None:
        self.max_attempts, self.redrive_max = max_attempts, redrive_max
        self.age_from = age_from
        """What ``max_age`` counts from: ``first``, the event's first publish (the promise:
        a redrive's republish does not make it younger), or ``delivery``, the publish time
        of the message its claim came with (the library before the redrive carried the first
        publish time; ``tests.sim.world.AGE_FROM``)."""
        self.records = records
        self.pending: list[Violation] = []
        self.runs: list[Run] = []
        self.effects: dict[str, list[Effect]] = defaultdict(list)
        self.ordered: dict[str, tuple[str, int]] = {}
        """Event key -> (entity key, position)."""
        self.projection: dict[str, tuple[int, str, Actor, bool]] = {}
        """Entity -> (position last written, the event's key, by whom, excused)."""
        self.attempts: dict[str, int] = defaultdict(int)
        self.redrives: dict[str, int] = defaultdict(int)
        self.acked: set[str] = set()
        self.origin: dict[str, datetime] = {}
        """Event key -> its first publish time (a redrive's republish does not make it
        younger: the route's ``max_age`` counts from the publisher's publish)."""
        self.max_age: dict[str, float] = {}
        """Event key -> its route's ``max_age`` in seconds (routes that have one)."""
        self.chosen: set[str] = set()
        """Keys an operator's replay reopened: it chose to run them whatever their age."""
        self.claims: dict[tuple[int, str], tuple[datetime, int, datetime | None]] = {}
        """(actor, key) -> the store's time, the attempt (less the record's parks) and the
        delivery's publish time of the live claim that took it last on that actor: what its
        run there was decided on."""
        self.expired_claims: set[str] = set()
        """Keys a live claim took past their ``max_age`` on the store's clock."""
        self.deferred: dict[str, tuple[datetime, datetime]] = {}
        """Key -> (its ``not_before``, the store's time it was stored): a deferral standing."""
        self.deferrals = 0
        """Deferrals stored in this run (``RetryAfter``, a handler's or a partner's)."""
        self.admissions: dict[int, tuple[datetime, Mapping[str, Any] | None]] = {}
        """Thread -> the store's time and the breaker a ``breaker_get`` of it read last
        (a sync partner call's admission is its thread's last read before the call)."""

    # -- told -----------------------------------------------------------------------
    def violate(self, family: type[Violation], text: str) -> None:
        """Record a broken promise; the next ``check`` raises it."""
        self.pending.append(family(text))

    def paused(self, actor: Actor) -> None:
        """``actor`` is frozen past its lease: what it runs or has on the wire may lapse."""
        self._excuse(actor, unrecorded=False)

    def died(self, actor: Actor) -> None:
        """``actor`` died: its runs end, an effect it had not recorded may be redone."""
        self._excuse(actor, unrecorded=True)

    def _excuse(self, actor: Actor, *, unrecorded: bool) -> None:
        for run in self.runs:
            if run.actor is actor and run.active:
                run.excused = True
        # On the wire, or returned and not yet stored: its guard lease may lapse unrenewed.
        for effect in (e for effects in self.effects.values() for e in effects):
            if effect.actor is actor and not effect.recorded:
                effect.excused = True

    def started(self, run: Run) -> None:
        """A handler starts: one per entity, never below its entity's SUCCESS (live)."""
        self.runs = [other for other in self.runs if other.active]
        if run.entity:
            for other in self.runs:
                if other.entity == run.entity and not other.excused:
                    self.violate(EntityOverlap, f"{run.key} (position {run.position}) started on "
                                                f"{run.actor.name} while {other.key} (position "
                                                f"{other.position}) ran on {other.actor.name}")
            if not run.replay:
                self._not_below(run)
        self.runs.append(run)
        if not run.replay:
            self._young(run)
            self.attempts[run.key] += 1
            if self.attempts[run.key] > self.max_attempts:
                self.violate(Miscounted, f"{run.key}'s handler ran {self.attempts[run.key]} "
                                         f"times (max_attempts {self.max_attempts})")

    def _not_below(self, run: Run) -> None:
        keys = [key for key, (entity, _) in self.ordered.items() if entity == run.entity]
        for record in self.records(keys):
            key = str(record.get("idempotency_key"))
            position = self.ordered[key][1]
            if applied(record) and run.position is not None and position > run.position:
                self.violate(OrderBroken, f"{run.key} (position {run.position}) started on "
                                          f"{run.actor.name} after {key} (position {position}) "
                                          "had succeeded")

    def ended(self, run: Run, parked: bool = False) -> None:
        """A handler returned or raised (a park gives its attempt back)."""
        run.active = False
        if parked and not run.replay:
            self.attempts[run.key] -= 1

    def invoked(self, guard: str, actor: Actor, unfenced: bool = False) -> Effect:
        """A guarded effect goes out: never twice per key (``unfenced``: its process was
        paused past the lease after its guard was taken, so it cannot be fenced)."""
        for earlier in self.effects[guard] if not unfenced else ():
            if not earlier.excused and earlier.state in ("flight", "ok"):
                stored = " and recorded" if earlier.recorded else ", its result never stored"
                self.violate(DuplicateEffect, f"guarded effect {guard} went out on {actor.name} "
                                              f"while an earlier one ({earlier.actor.name}) was "
                                              f"{earlier.state}{stored}")
        effect = Effect(guard, actor, excused=unfenced)
        self.effects[guard].append(effect)
        return effect

    def recorded(self, guard: str) -> None:
        """The guard stored the success of ``guard``'s latest effect."""
        for effect in reversed(self.effects[guard]):
            if effect.state == "ok" and not effect.recorded:
                effect.recorded = True
                return

    def project(self, entity: str, position: int, key: str, actor: Actor,
                excused: bool) -> None:
        """An ordered handler wrote its entity's projection (its last step).

        A write is judged at the end, and only if its event's SUCCESS stands: a
        handler's own write for an event that then failed is outside the promise.
        """
        self.projection[entity] = (position, key, actor, excused)

    def redriven(self, key: str, parked: bool) -> None:
        """A redrive of ``key`` was counted (a park's spends none)."""
        if parked:
            return
        self.redrives[key] += 1
        if self.redrives[key] > self.redrive_max:
            self.violate(Miscounted, f"{key} was redriven {self.redrives[key]} times "
                                     f"(redrive_max {self.redrive_max})")

    def reopened(self, key: str) -> None:
        """An operator's replay grants a fresh set of attempts, clears a deferral, and runs
        the event whatever its age (the operator chose it, as a rebuild's operator does)."""
        self.attempts[key] = 0
        self.deferred.pop(key, None)
        self.chosen.add(key)

    # -- RetryAfter and max_age (issue 43) --------------------------------------------
    def published(self, key: str, at: datetime) -> None:
        """A message of ``key`` was published at ``at`` (the first one is its origin)."""
        self.origin.setdefault(key, at)

    def age(self, key: str, now: datetime, actor: Actor) -> float | None:
        """Seconds at the store's ``now`` since ``key``'s first publish, or (``age_from``
        ``delivery``) since the publish of the message ``actor``'s claim of it came with."""
        origin = self.origin.get(key)
        if self.age_from == "delivery":
            origin = self.claims.get((id(actor), key), (now, 0, None))[2]
        return None if origin is None else (now - origin).total_seconds()

    def claimed(self, actor: Actor, key: str, now: datetime, attempt: int,
                published: datetime | None) -> None:
        """A live claim of ``actor`` took ``key`` at the store's ``now`` (its delivery
        published at ``published``): never before a standing deferral's ``not_before``; past
        ``max_age``, its run must not start and the event must end expired."""
        self.claims[(id(actor), key)] = (now, attempt, published)
        deferral = self.deferred.get(key)
        if deferral is not None:
            not_before, stored = deferral
            if stored <= now < not_before:
                self.violate(TooEarly, f"{key} was claimed on {actor.name} at {now:%H:%M:%S.%f} "
                                       f"(store's clock), before its not_before "
                                       f"{not_before:%H:%M:%S.%f} (deferred at "
                                       f"{stored:%H:%M:%S.%f})")
            else:
                del self.deferred[key]
        limit, age = self.max_age.get(key), self.age(key, now, actor)
        if limit is not None and age is not None and age > limit and key not in self.chosen:
            self.expired_claims.add(key)

    def _young(self, run: Run) -> None:
        """A live run starts: the claim it was decided on was within its ``max_age``."""
        limit = self.max_age.get(run.key)
        taken = self.claims.get((id(run.actor), run.key))
        if limit is None or taken is None or run.key in self.chosen:
            return
        age = self.age(run.key, taken[0], run.actor)
        if age is not None and age > limit:
            self.violate(ExpiryBroken, f"{run.key}'s handler ran live on {run.actor.name}: its "
                                       f"claim came {age:.0f} s after its {self.age_from} "
                                       f"publish on the store's clock, past its max_age of "
                                       f"{limit:g} s")

    def deferral(self, actor: Actor, key: str, record: Mapping[str, Any] | None,
                 not_before: datetime, now: datetime) -> None:
        """A finish of ``actor`` stored ``key`` deferred until ``not_before`` (``record``:
        as it stands now): it stands until then, and the attempt was spent."""
        stored = (record or {}).get("not_before")
        if record is None or record.get("event_status") != "FAILED" or \
                not isinstance(stored, datetime) or \
                abs((stored - not_before).total_seconds()) > 0.002:
            return  # fenced (another claim holds it, or finished it): this one deferred nothing
        self.deferred[key] = (stored, now)
        self.deferrals += 1
        # Spent: what the cap counts (attempts less parks) is what the claim took; a deferral
        # stored as a park, or its attempt given back, would let it defer for ever.
        taken = self.claims.get((id(actor), key))
        spent = record.get("attempts")
        spent = spent - parks(record) if isinstance(spent, int) else spent
        if taken is not None and spent != taken[1]:
            self.violate(Miscounted, f"{key} deferred on {actor.name} after attempt {taken[1]} "
                                     f"(less parks) is stored with {spent} spent")

    def expired(self, actor: Actor, key: str, now: datetime) -> None:
        """A finish of ``actor`` stores ``key`` expired at the store's ``now``: it was past its
        ``max_age`` then (counted as ``age_from`` says, on the store's clock)."""
        limit, age = self.max_age.get(key), self.age(key, now, actor)
        if limit is None or age is None or age <= limit:
            self.violate(ExpiryBroken, f"{key} was stored expired on {actor.name} "
                                       f"{'?' if age is None else f'{age:.0f}'} s after its "
                                       f"{self.age_from} publish on the store's clock, "
                                       f"within its max_age ({limit})")

    def rebuilt(self, key: str, error: str | None) -> None:
        """A rebuild counted ``key``'s result (``error``: as answered, the error's type
        first): it ignores ``max_age``, so it never answers ``Expired``."""
        if key in self.max_age and error and error.split(":")[0] == "Expired":
            self.violate(ExpiryBroken, f"the rebuild refused {key} for its max_age: {error}")

    def admitted(self, thread: int, now: datetime, breaker: Mapping[str, Any] | None) -> None:
        """A thread read a partner's breaker at the store's ``now``."""
        self.admissions[thread] = (now, breaker)

    def calling(self, thread: int, partner: str, actor: Actor) -> None:
        """A sync partner call goes out on ``thread``: its admission's read let it through."""
        now, breaker = self.admissions.pop(thread, (None, None))
        if now is None or not breaker or breaker.get("state") != "open":
            return
        until = breaker.get("open_until")
        if isinstance(until, datetime) and now < until:
            cause = (breaker.get("reason") or {}).get("cause")
            self.violate(TooEarly, f"a call to {partner} went out on {actor.name} though the "
                                   f"breaker it read at {now:%H:%M:%S} was open until "
                                   f"{until:%H:%M:%S} ({cause})")

    # -- checking -------------------------------------------------------------------
    def check(self) -> None:
        """At every point: raise the first violation recorded (its family)."""
        if self.pending:
            first = self.pending[0]
            raise type(first)("\n".join(dict.fromkeys(str(v) for v in self.pending
                                                      if type(v) is type(first))))

    def final(self, records: Mapping[str, Mapping[str, Any]],
              entities: Mapping[str, Mapping[str, Any]]) -> None:
        """After settling: nothing lost, every projection at its entity's applied position."""
        for key in sorted(self.acked):
            if key not in records:
                self.violate(Lost, f"{key} was acked but has no record")
        for key, record in sorted(records.items()):
            status = record.get("event_status")
            if status in ("PROCESSING", "PENDING"):
                self.violate(Lost, f"{key} is left {status} after every lease ran out and "
                                   "every sweep ran: nothing finishes it")
            elif status == "FAILED" and record.get("retryable") is True and \
                    not isinstance(record.get("redrive_at"), datetime):
                self.violate(Lost, f"{key} is FAILED-retryable with no redrive due")
        for key in sorted(self.expired_claims - self.chosen):
            record = records.get(key) or {}
            error = record.get("error") if isinstance(record.get("error"), Mapping) else {}
            expired = record.get("event_status") == "FAILED" and record.get("retryable") \
                is not True and (error or {}).get("classification") == "expired"
            if not expired and not (record.get("event_status") == "SUCCESS" and
                                    record.get("stale")):
                self.violate(ExpiryBroken, f"{key} was claimed past its max_age but ends "
                                           f"{record.get('event_status')} "
                                           f"({(error or {}).get('classification')}), not "
                                           "stored expired")
        top: dict[str, int] = {}
        for key, (entity, position) in self.ordered.items():
            record = records.get(key)
            if record is not None and applied(record):
                top[entity] = max(top.get(entity, position), position)
        for entity, (position, key, writer, excused) in sorted(self.projection.items()):
            stored = entities.get(entity, {}).get("position")
            want = top.get(entity)
            stands = applied(records.get(key) or {})
            if not excused and stands and want is not None and position != want:
                self.violate(OrderBroken, f"entity {entity[:14]}…'s projection ends at "
                                          f"{position} (written by {writer.name}) while its "
                                          f"newest applied event is {want} (stored position "
                                          f"{stored})")
        self.check()


def applied(record: Mapping[str, Any]) -> bool:
    """A SUCCESS that applied its event (not one stored as stale)."""
    return record.get("event_status") == "SUCCESS" and not record.get("stale")
