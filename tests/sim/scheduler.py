"""One seeded scheduler, one baton, virtual time: every actor runs only when handed the baton.

Actors (push processors, a pull batch, a rebuild, sweepers, operator commands)
run as real threads, but exactly one thread runs at a time: a thread runs only
while it holds the baton, and gives it up only at a **scheduling point**
(``point``: a store call before or after, an iteration of an actor's event
loop, a virtual sleep, a join). At each point the scheduler draws the same
four random numbers from one ``random.Random(seed)``, and from them decides:

* which runnable thread goes on (possibly the same one);
* a **fault** for the caller, where the point allows it: ``pause`` (its whole
  instance, heartbeat included, stops until past its lease), ``crash`` (a
  ``Crash``: the instance is dead, every later point of it raises too),
  ``unavailable`` (the store call raises ``StoreUnavailable``), ``shutdown``
  (the instance's processor is told ``stop(grace)``), or ``tick`` (virtual
  time moves a little).

Time is virtual: the store's ``FakeClock`` moves only when the scheduler
says (a tick, or when every thread waits for a time), in steps no longer
than a heartbeat interval, and each live, unpaused instance's heartbeat
beats at each step, as its background thread would. Nothing sleeps for real.

The same seed gives the same run: decisions depend only on the seed and on
what ran before. ``limit`` (decisions after it are fault-free) and ``muted``
(points whose fault is dropped) shrink a failing run without shifting the
random stream.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eventbus.testing import FakeClock

STAY = 0.65
"""The share of points at which the running thread simply goes on."""
WAIT = 20.0
"""Real seconds a thread waits for the baton before the run is called stuck (a real block)."""


class _Workers:
    """Real threads for one run: a ``SimThread`` runs on an idle one (starting a thread costs
    more than a whole scheduling point); a new one starts only when none is idle."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on an idle worker (or a new one)."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._tasks.put(task)
        if start:
            thread = threading.Thread(target=self._serve, name="sim-worker", daemon=True)
            self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """End every worker (each ends after its task)."""
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(WAIT)

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()
            with self._lock:
                self._idle += 1


class Crash(BaseException):
    """The instance died here: a BaseException, so no handler or stage of the library catches it."""


class Abort(BaseException):
    """The run is over (a violation was found, or it is stuck): every thread unwinds."""


class Stuck(AssertionError):
    """No thread can run and no virtual time is awaited: a deadlock in the simulated system."""


@dataclasses.dataclass(eq=False)
class Actor:
    """One simulated process: its clock offset, its fate, and what the scheduler may do to it."""

    name: str
    kind: str
    offset: float = 0.0
    faults: tuple[str, ...] = ("pause", "crash", "unavailable", "tick")
    """The faults this actor may suffer (``shutdown`` only for processors with a loop)."""
    dead: bool = False
    paused_until: float = 0.0
    pauses: int = 0
    """How often it was paused past its lease."""
    processor: Any = None
    """Its processor: the heartbeat beats while it lives, ``stop`` is a shutdown."""
    stopping: bool = False
    on_pause: Callable[[Actor], None] = lambda actor: None
    on_death: Callable[[Actor], None] = lambda actor: None

    def beat(self) -> None:
        """One heartbeat round of its processor (renews what it holds)."""
        if self.processor is not None:
            self.processor.heartbeat.beat()


@dataclasses.dataclass(eq=False)
class SimThread:
    """A real thread that runs only with the baton."""

    serial: int
    actor: Actor
    name: str
    state: str = "ready"
    """``ready``, ``blocked`` (until ``wake_at`` or ``ready``) or ``done``."""
    wake_at: float | None = None
    ready: Callable[[], bool] | None = None
    error: BaseException | None = None
    main: bool = False
    """The actor's own body (not a loop or an executor thread of it)."""
    go: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set when this thread is handed the baton."""


class Scheduler:
    """The baton, the seeded decisions, virtual time, and what was reached (see the module)."""

    def __init__(self, seed: int, clock: FakeClock, *, lease: float, fault_rate: float,
                 limit: int | None = None, muted: Iterable[int] = ()) -> None:
        self.rng = random.Random(seed)
        self.clock, self.lease, self.fault_rate = clock, lease, fault_rate
        self.limit, self.muted = limit, frozenset(muted)
        self.beat_every = lease / 4
        self.all_done = threading.Event()
        self.workers = _Workers()
        self.threads: list[SimThread] = []
        self.actors: list[Actor] = []
        self.current: SimThread | None = None
        self.local = threading.local()
        self.quiet = 0
        """Above 0: store calls pass straight through (heartbeats, the ledger's reads)."""
        self.faults_on = True
        self.points = 0
        self.kinds: collections.Counter[str] = collections.Counter()
        """Scheduling points reached, by kind (``store-before``, ``await``, ...)."""
        self.decisions: collections.Counter[str] = collections.Counter()
        """Faults and switches decided, by kind."""
        self.trace: list[str] = []
        self.faulted: list[int] = []
        """The points at which a fault was decided (what shrinking mutes)."""
        self.failure: BaseException | None = None
        self.tracing = False
        """Also trace every switch (a shrunk run's report)."""
        self.check: Callable[[], None] = lambda: None
        self._serials = iter(range(1, 1 << 30))

    # -- time ---------------------------------------------------------------------------
    def now(self) -> float:
        """Virtual time: the store's clock, in epoch seconds."""
        return self.clock().timestamp()

    def advance(self, seconds: float) -> None:
        """Move virtual time; live, unpaused instances' heartbeats beat on the way."""
        left = seconds
        while left > 1e-9:
            step = min(self.beat_every, left)
            self.clock.advance(step)
            left -= step
            now = self.now()
            self.quiet += 1
            try:
                # A resumed instance's heartbeat beats next only an interval after it resumed,
                # so what it does first after a pause is reached before its renewals say "lost".
                for actor in self.actors:
                    if not actor.dead and actor.paused_until <= now - self.beat_every:
                        actor.beat()
            finally:
                self.quiet -= 1

    # -- threads ------------------------------------------------------------------------
    def me(self) -> SimThread | None:
        """The calling thread's ``SimThread``; None for the driver (or any other thread)."""
        return getattr(self.local, "thread", None)

    def spawn(self, actor: Actor, body: Callable[[], Any], name: str, *,
              main: bool = False) -> SimThread:
        """A new thread of ``actor``; it runs when the scheduler first hands it the baton."""
        sim = SimThread(next(self._serials), actor, name, main=main)

        def run() -> None:
            self.local.thread = sim
            if not sim.go.wait(WAIT):
                sim.error = Stuck(f"{name} never got the baton")
            sim.go.clear()
            try:
                if sim.error is None:
                    if actor.dead:
                        raise Crash(f"{actor.name} is dead")
                    body()
            except (Crash, Abort) as exc:
                sim.error = exc
            except BaseException as exc:  # kept; the world reports what escaped
                sim.error = exc
            finally:
                sim.state = "done"
                self._switch(sim)

        self.threads.append(sim)
        self.workers.submit(run)
        return sim

    def run(self) -> None:
        """From the driver: hand out the baton until every thread is done (or the run aborts)."""
        self.all_done.clear()
        nxt = self._next(self.rng.random())
        self.current = nxt
        if nxt is None:
            return
        nxt.go.set()
        if not self.all_done.wait(WAIT * 3):
            self.failure = self.failure or Stuck("the run did not end: a real block somewhere")
            raise Abort("stuck")

    # -- points -------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """Put what happened (a handler started, a call returned) into the trace."""
        me = self.me()
        self.trace.append(f"   {me.name if me is not None else 'driver'}: {text}")

    def point(self, kind: str, faults: Sequence[str] = (), detail: str = "") -> str:
        """A scheduling point of the calling thread; return the fault it must raise ("" none).

        ``pause`` and ``tick`` are applied here; ``crash`` raises ``Crash`` here;
        ``unavailable`` and ``shutdown`` are returned for the caller to apply.
        """
        me = self.me()
        if me is None or self.quiet:
            return ""
        fault = self._decide(me, kind, faults, detail)
        self._switch(me)
        self._resumed(me)
        if fault == "crash":
            raise Crash(f"{me.actor.name} crashed at {kind}")
        return fault

    def pause(self, actor: Actor, seconds: float, why: str) -> None:
        """Freeze ``actor`` (its whole instance) for ``seconds`` now: a pause the world aims
        (right after a claim, ``tests.sim.world``), not one the draws of a point decide; the
        caller's next point hands the baton on."""
        me = self.me()
        actor.paused_until = self.now() + seconds
        actor.pauses += 1
        actor.on_pause(actor)
        self.decisions["pause"] += 1
        self.trace.append(f"#{self.points} {me.name if me is not None else 'driver'} {why}: "
                          f"pause {seconds:.1f}s")

    def sleep(self, seconds: float, kind: str = "sleep") -> None:
        """A virtual wait of the calling thread (a hanging handler, a sweeper's interval)."""
        me = self.me()
        if me is None or self.quiet:
            self.advance(seconds)
            return
        self._decide(me, kind, ("pause", "crash"))
        self.block(wake_at=self.now() + seconds)

    def block(self, *, wake_at: float | None = None,
              ready: Callable[[], bool] | None = None) -> None:
        """Wait (giving up the baton) until virtual ``wake_at`` or until ``ready()``."""
        me = self.me()
        assert me is not None
        me.state, me.wake_at, me.ready = "blocked", wake_at, ready
        self._switch(me)
        me.wake_at, me.ready = None, None
        self._resumed(me)

    def _resumed(self, me: SimThread) -> None:
        if self.failure is not None:
            raise Abort(str(self.failure))
        if me.actor.dead:
            raise Crash(f"{me.actor.name} is dead")

    def _decide(self, me: SimThread, kind: str, faults: Sequence[str], detail: str = "") -> str:
        if self.failure is not None:
            raise Abort(str(self.failure))
        if me.actor.dead:
            raise Crash(f"{me.actor.name} is dead")
        self.points += 1
        self.kinds[kind] += 1
        index = self.points
        roll, which, extra = self.rng.random(), self.rng.random(), self.rng.random()
        allowed = [f for f in faults if f in me.actor.faults]
        fault = ""
        if allowed and self.faults_on and roll < self.fault_rate and index not in self.muted \
                and (self.limit is None or index <= self.limit):
            fault = allowed[int(which * len(allowed))]
        if fault:
            self.faulted.append(index)
            self.decisions[fault] += 1
            self.trace.append(f"#{index} {me.name} at {kind} {detail}: {fault}")
        if fault == "pause":
            me.actor.paused_until = self.now() + self.lease * (1.1 + 2.0 * extra)
            me.actor.pauses += 1
            me.actor.on_pause(me.actor)
        elif fault == "tick":
            self.advance(0.5 + 4.0 * extra)
        elif fault == "crash":
            me.actor.dead = True
            me.actor.on_death(me.actor)
        try:
            self.check()
        except AssertionError as exc:
            self.failure = exc
            self.trace.append(f"#{index} {me.name} at {kind}: VIOLATION {type(exc).__name__}")
            raise Abort(str(exc)) from exc
        return fault

    # -- the baton ----------------------------------------------------------------------
    def _runnable(self, thread: SimThread, now: float) -> bool:
        if thread.state == "done":
            return False
        if thread.actor.paused_until > now and not thread.actor.dead and self.failure is None:
            return False
        # A dead instance's threads all die with it: one blocked on something only another of
        # its threads would have finished (a loop thread that never ran) unwinds with ``Crash``
        # here, instead of blocking the run for good (a ``Stuck`` that then hid behind the
        # settling's "left PROCESSING": seeds 1277, 1490).
        if thread.state == "ready" or self.failure is not None or thread.actor.dead:
            return True
        if thread.wake_at is not None and now >= thread.wake_at:
            return True
        return thread.ready is not None and thread.ready()

    @staticmethod
    def _runs_at(thread: SimThread) -> float | None:
        """When a waiting thread may run again by time alone (None: only a wake-up frees it)."""
        paused = thread.actor.paused_until if not thread.actor.dead else 0.0
        if thread.wake_at is None:
            return paused if paused > 0 else None
        return max(thread.wake_at, paused)

    def _next(self, roll: float) -> SimThread | None:
        """The thread to run next (virtual time moves when all wait for it); None: all done."""
        while True:
            now = self.now()
            runnable = [t for t in self.threads if self._runnable(t, now)]
            if runnable:
                return runnable[int(roll * len(runnable))]
            waiting = [t for t in self.threads if t.state != "done"]
            if not waiting:
                return None
            times = [moment for moment in map(self._runs_at, waiting)
                     if moment is not None and moment > now]
            if not times:
                self.failure = self.failure or Stuck(
                    "no thread can run and none waits for a time: " +
                    ", ".join(f"{t.name} ({t.state})" for t in waiting))
                continue  # with a failure, every thread is runnable (to unwind)
            self.advance(max(min(times) - now, 0.0) + 1e-3)

    def _switch(self, me: SimThread) -> None:
        """Give the baton to the next thread (maybe ``me``); return when ``me`` has it again."""
        roll = self.rng.random()
        # Mostly the caller goes on (a switch costs two real thread wake-ups); at a third of
        # the points any runnable thread, the caller included, may be next.
        nxt = me if roll < STAY and me.state == "ready" and self._runnable(me, self.now()) \
            else self._next((roll - STAY) / (1 - STAY) if roll >= STAY else roll / STAY)
        self.current = nxt
        if nxt is me:
            me.state = "ready"
            return
        if nxt is None:
            self.all_done.set()
        else:
            self.decisions["switch"] += 1
            if self.tracing:
                self.trace.append(f"   -> {nxt.name}")
            nxt.go.set()
        if me.state == "done":
            return
        if not me.go.wait(WAIT):
            self.failure = self.failure or Stuck(f"{me.name} lost the baton for good")
            raise Abort("stuck")
        me.go.clear()
        me.state = "ready"
