"""Time, in one place: the store's clock, lease arithmetic, and a process's own waits.

The rule (REFERENCE.md, "Time"): every comparison of a lease, an entity hold,
a guard's lease, a breaker or rate window, a redrive or an abandon time
against "now" is made on **the store's clock**, never on one instance's:

* MongoDB decides inside the write with ``$$NOW`` (``store_now()`` here is
  the expression), so a frozen process or a skewed host cannot move a lease;
* the in-memory store reads its own injected clock;
* what a process must compute before it writes (a breaker's next probe, a
  parked event's ``redrive_at``) comes from ``store.now()``: on MongoDB the
  server's clock as last read (``hello.localTime``) plus this process's
  monotonic time since, never its wall clock.

A process's own clock (``time.monotonic``, ``time.sleep``) times only its own
waits. Tests move the store's clock with a ``Shift`` (MongoDB) or a
``FakeClock`` (memory), both of which have ``advance(seconds)``.

May import: the standard library only (the store's documents import
``bson_time`` from here, so every layer truncates time one way).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

Now = Callable[[], datetime]
"""A clock: returns the current time, timezone-aware. The one name for it: the
processor's and telemetry's ``Clock`` are this type under the names they used."""
Monotonic = Callable[[], float]


@runtime_checkable
class Clock(Protocol):
    """A whole clock, as ``eventbus.testing.FakeClock`` is one: the time, a wait, a monotonic
    reading. Code handed a ``Clock`` as its ``now`` waits and times on it too (partners)."""

    def __call__(self) -> datetime:
        """The current time, timezone-aware."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...

    def monotonic(self) -> float:
        """Seconds that only move forward, for timing waits and calls."""
        ...


class SystemClock:
    """The process's own clock as a ``Clock``: ``utcnow``, ``time.sleep``, ``time.monotonic``."""

    def __call__(self) -> datetime:
        """The wall clock, UTC."""
        return utcnow()

    def sleep(self, seconds: float) -> None:
        """Really wait."""
        time.sleep(seconds)

    def monotonic(self) -> float:
        """``time.monotonic``."""
        return time.monotonic()

_MILLISECOND = timedelta(milliseconds=1)


def utcnow() -> datetime:
    """The process's wall clock, UTC and aware (only for stamps and a store's own default)."""
    return datetime.now(UTC)


def bson_time(moment: datetime) -> datetime:
    """Return ``moment`` as BSON stores it: UTC, aware, truncated to the millisecond.

    Comparing in Python at a finer grain than the server would let the two
    halves of a rule (the server's and the memory store's) disagree. A naive
    datetime is taken as UTC, as pymongo does.
    """
    if moment.tzinfo is UTC and not moment.microsecond % 1000 and type(moment) is datetime:
        return moment  # already at BSON's grain (a push asks several times): nothing to redo
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.replace(microsecond=aware.microsecond // 1000 * 1000)


def lease_end(now: datetime, lease: timedelta) -> datetime:
    """When a lease (or hold) taken at ``now`` for ``lease`` runs out, at the store's grain."""
    return bson_time(bson_time(now) + lease)


def millis(span: timedelta) -> int:
    """``span`` in whole milliseconds (what ``$add`` to a BSON date takes)."""
    return span // _MILLISECOND


@dataclasses.dataclass
class Shift:
    """A movable offset of a store's clock: 0 in production, moved by tests (``advance``).

    Tests of the MongoDB store move its clock with it, as tests of the memory
    store move a ``FakeClock``; the offset is added to ``$$NOW`` in every
    expression the store builds (``store_now``), so the server still decides.
    """

    seconds: float = 0.0

    def advance(self, seconds: float) -> None:
        """Move the store's clock forward by ``seconds``."""
        self.seconds += seconds

    @property
    def delta(self) -> timedelta:
        """The offset as a ``timedelta``."""
        return timedelta(seconds=self.seconds)


def store_now(shift: Shift | None = None, plus: timedelta = timedelta(0)) -> Any:
    """The aggregation expression of the store's "now" (``$$NOW``), plus ``plus``.

    Used inside update pipelines (never a filter: a server may refuse ``$$NOW``
    in an indexed one), so the server's clock decides every lease at the
    moment of the write.
    """
    offset = millis(plus + shift.delta if shift is not None and shift.seconds else plus)
    return "$$NOW" if offset == 0 else {"$add": ["$$NOW", offset]}


class ServerClock:
    """The server's clock as this process sees it: its last reading plus monotonic time since.

    Hand-written because no driver exposes it: ``read`` asks the server
    (``hello``'s ``localTime``) once, then every ``resync`` seconds; between
    readings the process's monotonic clock (which no wall-clock change
    moves) measures the time since. Used only where a process must compute a
    time before its write (``redrive_at``, a breaker's window); leases are
    decided by ``$$NOW`` inside the write itself.
    """

    def __init__(self, read: Now, *, shift: Shift | None = None, resync: float = 300.0,
                 monotonic: Monotonic = time.monotonic) -> None:
        self._read, self._shift, self._resync, self._monotonic = read, shift, resync, monotonic
        self._lock = threading.Lock()
        self._base: tuple[datetime, float] | None = None

    def __call__(self) -> datetime:
        """The store's current time (its clock as last read, moved on by monotonic time)."""
        base = self._base
        at = self._monotonic()
        if base is None or at - base[1] > self._resync:
            base = self._sync()
            at = self._monotonic()
        moment = base[0] + timedelta(seconds=at - base[1])
        # No offset (production): no second timedelta to build and add.
        return moment + self._shift.delta if self._shift is not None and self._shift.seconds \
            else moment

    def _sync(self) -> tuple[datetime, float]:
        with self._lock:
            before = self._monotonic()
            read = self._read()
            after = self._monotonic()
            # The server read its clock about halfway through the round trip.
            self._base = (bson_time(read), (before + after) / 2)
            return self._base
