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
* ``Escaped``: ``Processor.run`` raised.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

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


FAMILIES: tuple[type[Violation], ...] = (DuplicateEffect, EntityOverlap, OrderBroken, Miscounted,
                                         RebuildCalled, ResumeLeft, Lost, Escaped)


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
                 records: Callable[[Sequence[str]], list[Mapping[str, Any]]]) -> None:
        self.max_attempts, self.redrive_max = max_attempts, redrive_max
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
        """An operator's replay grants a fresh set of attempts."""
        self.attempts[key] = 0

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
