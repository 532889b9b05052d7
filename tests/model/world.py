"""The model's world: one store, several processor instances with their own clocks, a broker.

``World`` is what the stateful test (``test_model``) and the crash-point
test (``test_crash_points``) drive, one step at a time:

* **one store** (``MemoryBackend`` or ``MongoBackend``) whose clock the world
  moves (``advance``): a ``FakeClock`` for memory, a ``Shift`` for MongoDB;
* **instances**: each a ``Processor`` with its own clock, ``store.now() +
  offset`` (a host whose clock is off by seconds or minutes; its monotonic
  clock counts the world's time, offset or not), its own inline
  relay and heartbeat, over a ``CrashingStore`` that kills it at a chosen
  store call (before or after it), after which it makes no call at all;
* **runs** on threads, handed off deterministically: a step starts a run and
  waits until it finishes or its handler **hangs** (blocks on an event only
  the world sets), so other steps interleave while it runs and no two
  threads ever run at once; nothing sleeps for real;
* **a broker** (``Broker``) that keeps every message (the roots the steps
  create, and what the relay, the redrive and replays publish);
* **the ledger** (``tests.model.ledger``), told what happens.

Time is chosen so no comparison ever ties: the store's clock starts one
second past a multiple of ten and moves in whole even seconds, offsets are
even, and every lease, window and delay is a half or odd number of seconds.
So a step's outcome never depends on a millisecond (MongoDB's clock runs on
in real time between steps; the world puts it back at each step).

Handlers (one router for all instances):

* ``CALL``: a guarded partner call, ``context.guard.run(guard, lambda:
  context.partner(p).call(effect))``, the guard key its own or one shared
  with other events; may ``emit`` a ``NOTIFY`` child;
* ``ORDER``: ``ordered_by="entity_data.seq"``, with or without a guarded
  partner call; version ``v0`` has an upcaster that raises;
* ``NOTIFY`` (internal): a guarded call to the partner of its parent.

What a handler (or its effect) does is its event's **plan**, one behaviour
per run: ``pass``, ``transient``, ``permanent`` or ``hang``; past the plan,
and while the world settles, it passes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from pymongo import MongoClient

from eventbus.clock import Shift
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import BreakerOpen, PartnerPaused, PermanentError, RateLimited
from eventbus.model.event import Event, parse_event
from eventbus.model.keys import record_key
from eventbus.model.order import entity_key
from eventbus.model.router import Router
from eventbus.ops.replay import Replayer
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners, partner_name
from eventbus.partners.documents import is_parked
from eventbus.partners.store import PartnerStore, store_beside
from eventbus.processor import Heartbeat, Processor, Result
from eventbus.settings import Settings
from eventbus.store.base import BatchClaim, Claim, EntityHolds, EventStore, Finish, Finished
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.workers.redrive import Redriver
from tests.model.ledger import Escaped, HandlerRun, Invocation, Ledger, Lost

LEASE_SECONDS = 21.5
"""Half a second off every sum of the world's even steps: no lease ends on a step."""
BEAT_SECONDS = 4.0
"""A live instance renews its leases this often (under a quarter of the lease, as in production)."""
RATE_WINDOW, RATE_LIMIT = 10.0, 1
"""``slow`` takes 0.1 calls/s: one call per 10 s window."""
BREAKER_SECONDS = 31.0
OFFSETS = (0.0, -600.0, 600.0, -30.0, 30.0)
"""Clock offsets an instance may have (0 first: hypothesis shrinks towards it)."""
START = datetime(2026, 1, 1, 12, 0, 1, tzinfo=UTC)
"""One second past a rate window's start; even steps never reach a boundary."""
WAIT = 30.0
"""Real seconds a step waits for a run to finish or hang before calling it stuck."""
PARTNERS = ("fast", "slow")
"""``slow`` has a shared rate; both have breakers."""
BEHAVIOURS = ("pass", "transient", "permanent", "hang")

SETTINGS = Settings(
    lease_seconds=LEASE_SECONDS, max_attempts=3,
    redrive_after_seconds=61.0, redrive_max=3, redrive_backoff_cap_seconds=61.0,
    breaker_failures=2, breaker_open_seconds=BREAKER_SECONDS,
    breaker_open_cap_seconds=BREAKER_SECONDS, breaker_probe_seconds=BREAKER_SECONDS,
    partner_rates=(("slow", RATE_LIMIT / RATE_WINDOW),),
    relay_budget_seconds=60.0,
).model_copy(update={"order_wait_seconds": 0.0, "partner_rate_wait_seconds": 0.0})
"""The world's settings: small caps so caps are reached, odd delays so nothing ties. No waits
for an entity or a partner's rate: 0 s is below what their variables take (above 0), so those
two are set unvalidated (``model_copy``, as ``Settings`` took any value before pydantic)."""


class Crash(BaseException):
    """The instance's process died here: a BaseException, so no handler or stage catches it."""


# -- stores ---------------------------------------------------------------------------
class Backend(Protocol):
    """One store and the clock the world moves it with."""

    store: EventStore
    slack: float
    """Seconds by which the store's own decisions may differ from ``now()`` (a real server's
    clock is only ever read to a few milliseconds)."""

    def now(self) -> datetime:
        """The store's clock, as the world set it (exact)."""
        ...

    def advance(self, seconds: float) -> None:
        """Move the store's clock forward."""
        ...

    def sync(self) -> None:
        """Put the store's clock back on the world's (MongoDB's runs on in real time)."""
        ...


class MemoryBackend:
    """``MemoryEventStore`` on a ``FakeClock``: its own clock, moved by hand."""

    slack = 0.0

    def __init__(self) -> None:
        self.clock = FakeClock(START)
        self.store: EventStore = MemoryEventStore(lease=timedelta(seconds=LEASE_SECONDS),
                                                  clock=self.clock)

    def now(self) -> datetime:
        """The fake clock's time."""
        return self.clock()

    def advance(self, seconds: float) -> None:
        """Move the fake clock."""
        self.clock.advance(seconds)

    def sync(self) -> None:
        """Nothing runs on by itself in memory."""


class MongoBackend:
    """``MongoEventStore`` on a real server, its clock moved by a ``Shift``.

    The collections of ``database`` are emptied first (indexes kept), so
    examples share one database cheaply. The world's time starts on the
    server's clock, one second past a multiple of ten.
    """

    slack = 0.5

    def __init__(self, client: MongoClient, database: str) -> None:
        settings = SETTINGS.model_copy(update={"mongodb_db": database})  # its 0 s waits
        for name in (settings.collection, settings.guard_collection,
                     settings.partner_collection):
            client[database][name].delete_many({})
        from eventbus.store.mongo import MongoEventStore

        self.shift = Shift()
        self.store: EventStore = MongoEventStore.from_settings(settings, client, shift=self.shift)
        server = self.store.now().timestamp()
        self.moment = datetime.fromtimestamp(math.floor(server / 10) * 10 + 1, UTC)
        self.sync()

    def now(self) -> datetime:
        """The world's time for the store."""
        return self.moment

    def advance(self, seconds: float) -> None:
        """Move the store's clock (its ``Shift``)."""
        self.moment += timedelta(seconds=seconds)
        self.sync()

    def sync(self) -> None:
        """Shift the store's clock so that it reads the world's time again."""
        self.shift.advance((self.moment - self.store.now()).total_seconds())


# -- instances -------------------------------------------------------------------------
class _Sibling:
    """``CrashingStore.sibling``: ``store``'s calls go through ``parent``'s count and crash."""

    def __init__(self, parent: CrashingStore, store: Any) -> None:
        self._parent, self._store = parent, store

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name.startswith("_") or name in CrashingStore.PASSIVE or not callable(attribute):
            return attribute
        return functools.partial(self._parent._call, name, attribute)


class CrashingStore:
    """A store proxy that counts the calls an instance makes, and kills it at one of them.

    ``arm(n, when)``: the ``n``-th call from now raises ``Crash`` before it
    reaches the store, or after (what it did is stored); from then on the
    instance is dead and every call raises ``Crash``. ``now`` is a read of the
    clock, not a store call: it is passed through and not counted.
    """

    PASSIVE = frozenset({"now"})

    def __init__(self, store: EventStore,
                 observe: Callable[[str, tuple[Any, ...], Mapping[str, Any], Any], None]) -> None:
        self._store, self._observe = store, observe
        self.calls: list[str] = []
        self.armed: tuple[int, str] | None = None
        self.dead = False

    def arm(self, calls: int, when: str) -> None:
        """Crash at the ``calls``-th store call from now, ``before`` or ``after`` it."""
        self.armed = (len(self.calls) + calls, when)

    def sibling(self, store: Any) -> Any:
        """A proxy of another of the instance's stores (its partners') whose calls count and
        crash with this one's: one instance, one count, one death."""
        return _Sibling(self, store)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name.startswith("_") or name in self.PASSIVE or not callable(attribute):
            return attribute
        return functools.partial(self._call, name, attribute)

    def _call(self, name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.dead:
            raise Crash(f"dead instance called {name}")
        index = len(self.calls)
        self.calls.append(name)
        armed = self.armed is not None and self.armed[0] == index
        if armed and self.armed is not None and self.armed[1] == "before":
            self.dead = True
            raise Crash(f"crashed before {name} (call {index})")
        result = method(*args, **kwargs)
        self._observe(name, args, kwargs, result)
        if armed:
            self.dead = True
            raise Crash(f"crashed after {name} (call {index})")
        return result


class InstanceClock:
    """An instance's own clock: the store's plus its offset; its waits return at once."""

    def __init__(self, store_now: Callable[[], datetime], offset: float) -> None:
        self._store_now, self.offset = store_now, offset

    def __call__(self) -> datetime:
        """What this host's clock reads now."""
        return self._store_now() + timedelta(seconds=self.offset)

    def sleep(self, seconds: float) -> None:
        """A wait of this process: the world moves time, so it returns at once."""

    def monotonic(self) -> float:
        """This process's monotonic clock: the time that passed (the store's), not its offset.

        A host's wall clock may be off or jump (``offset``); its monotonic clock
        only counts the seconds that pass, which in the world is the store's time.
        """
        return self._store_now().timestamp()


@dataclasses.dataclass(eq=False)
class Instance:
    """One service process: a processor over a store proxy, with its own clock."""

    slot: int
    clock: InstanceClock
    store: CrashingStore
    processor: Processor
    frozen: bool = False
    buried: bool = False
    """Its death was seen and dealt with (its hangs released, the ledger told)."""

    @property
    def dead(self) -> bool:
        """True once a crash killed it."""
        return self.store.dead

    @property
    def healthy(self) -> bool:
        """Alive and not frozen: its heartbeat keeps what it holds."""
        return not self.dead and not self.frozen

    def redriver(self, publisher: Broker) -> Redriver:
        """The redrive sweeper as this instance would run it (its clock, its store calls)."""
        partners = self.processor.partners
        return Redriver(cast(EventStore, self.store), publisher, SETTINGS, now=self.clock,
                        locate=self.processor.locate,
                        partners=partners.store if partners is not None else None)

    def relay(self, publisher: Broker) -> Relay:
        """The outbox relay as this instance would run it."""
        return Relay(cast(EventStore, self.store), publisher, now=self.clock,
                     sleep=self.clock.sleep)


# -- messages and runs -----------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Message:
    """A message the broker holds: a root a step created, or one something published."""

    data: bytes
    attributes: dict[str, str]
    key: str
    source: str
    """``root`` (created by a step) or ``published`` (relay, redrive, replay)."""
    delivered: bool = False
    acked: bool = False

    def delivery(self, number: int) -> Delivery:
        """The delivery of this message, as Pub/Sub would push it."""
        return Delivery(self.data, dict(self.attributes), message_id=f"m-{number}")


class Broker:
    """The event bus: what is published is kept as a message the world may deliver."""

    def __init__(self, world: World) -> None:
        self.world = world

    def publish_message(self, data: bytes, attributes: Mapping[str, str], *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        """Keep the message; the world delivers it when a step (or the settling) says."""
        self.world.add(data, attributes, "published")
        return f"bus-{len(self.world.messages)}"


@dataclasses.dataclass(eq=False)
class Run:
    """One ``Processor.run`` on its own thread."""

    instance: Instance
    messages: list[Message]
    results: list[Result] | None = None
    error: BaseException | None = None
    crashed: bool = False
    done: bool = False
    blocked: Hang | None = None
    claimed: set[str] = dataclasses.field(default_factory=set)
    thread: threading.Thread | None = None
    ident: int = 0


@dataclasses.dataclass(eq=False)
class Hang:
    """A handler blocked until the world releases it."""

    run: Run
    label: str
    event: threading.Event = dataclasses.field(default_factory=threading.Event)


# -- the world -------------------------------------------------------------------------
class World:
    """The store, the instances, the broker and the ledger; each method is one step."""

    def __init__(self, backend: Backend, offsets: Sequence[float]) -> None:
        self.backend, self.store = backend, backend.store
        self.ledger = Ledger(SETTINGS, rate_window=RATE_WINDOW, rate_limit=RATE_LIMIT,
                             breaker_window=BREAKER_SECONDS, rated={"slow"},
                             slack=backend.slack)
        self.router = self._router()
        self.broker = Broker(self)
        self.messages: list[Message] = []
        self.fresh: list[Message] = []
        """Published and not yet delivered (the settling delivers them)."""
        self.plans: dict[str, list[str]] = {}
        self.settling = False
        self.hangs: list[Hang] = []
        self._runs: list[Run] = []
        self._by_thread: dict[int, Run] = {}
        self._local = threading.local()
        self._cond = threading.Condition()
        self._numbers = iter(range(1, 1 << 30))
        """Numbers events (keys c1, o2, ...) in the order the steps create them."""
        self._deliveries = iter(range(1, 1 << 30))
        self.instances = [self._instance(slot, offset) for slot, offset in enumerate(offsets)]

    # -- building ------------------------------------------------------------------
    def _instance(self, slot: int, offset: float) -> Instance:
        clock = InstanceClock(self.backend.now, offset)
        proxy = CrashingStore(self.store, functools.partial(self._observe, slot))
        store = cast(EventStore, proxy)
        relay = Relay(store, self.broker, now=clock, sleep=clock.sleep)
        # Its monotonic clock is the world's too: with the real one, no wait of the world
        # would ever be a quarter lease, and a lane would never confirm its hold.
        partners = cast(PartnerStore, proxy.sibling(store_beside(self.store, SETTINGS)))
        processor = Processor(store, self.router, SETTINGS, clock, after_success=relay,
                              heartbeat=Heartbeat(store, now=clock, background=False),
                              sleep=clock.sleep, monotonic=clock.monotonic,
                              partners=Partners(partners, SETTINGS, now=clock, sleep=clock.sleep,
                                                monotonic=clock.monotonic))
        return Instance(slot, clock, proxy, processor)

    def _router(self) -> Router:
        routes = Router()

        @routes.handler("CALL")
        def call(context: Context) -> None:
            data = context.event.entity_data
            self._handle(context, context.event.entity_metadata.partner_id, str(data["guard"]))
            if data.get("emit"):
                context.emit("NOTIFY", {"of": context.key})

        @routes.handler("ORDER", ordered_by="entity_data.seq", upcasters={"v0": _unreadable})
        def order(context: Context) -> None:
            call = bool(context.event.entity_data.get("call"))
            self._handle(context, "slow" if call else "", f"order:{context.key}")

        @routes.handler("NOTIFY", internal=True)
        def notify(context: Context) -> None:
            self._handle(context, context.event.entity_metadata.partner_id,
                         f"notify:{context.key}")

        return routes

    # -- creating messages ---------------------------------------------------------
    def add(self, data: bytes, attributes: Mapping[str, str], source: str) -> Message:
        """Keep a message the broker holds from now on."""
        message = Message(data, dict(attributes), _message_key(data, attributes), source)
        self.messages.append(message)
        if source == "published":
            self.fresh.append(message)
        return message

    def new_call(self, partner: str, *, shared: bool, emit: bool, plan: Sequence[str]) -> str:
        """A root ``CALL`` event (a guarded call to ``partner``); return its key."""
        number = next(self._numbers)
        guard = "call:shared" if shared else f"call:{number}"
        body = _event("CALL", partner, f"c{number}", "Call",
                      {"n": number, "guard": guard, "emit": emit})
        message = self.add(body, {"idempotency_key": f"c{number}"}, "root")
        self.plans[message.key] = list(plan)
        return message.key

    def add_call(self, partner: str) -> Message:
        """A root ``CALL`` event that passes, as a message (``new_call``'s, for batches)."""
        self.new_call(partner, shared=False, emit=False, plan=[])
        return self.messages[-1]

    def new_order(self, entity: str, seq: int, *, plan: Sequence[str], call: bool = False,
                  unreadable: bool = False) -> str:
        """A root ``ORDER`` event of ``entity`` at position ``seq``; return its key."""
        number = next(self._numbers)
        body = _event("ORDER", "slow", entity, "Order", {"n": number, "seq": seq, "call": call},
                      version="v0" if unreadable else "v1")
        message = self.add(body, {"idempotency_key": f"o{number}"}, "root")
        self.plans[message.key] = list(plan)
        self.ledger.ordered[message.key] = (entity_key("slow", "Order", entity), seq)
        return message.key

    # -- steps ---------------------------------------------------------------------
    def step(self) -> None:
        """Start a step: the store's clock reads the world's time again."""
        self.backend.sync()

    def eligible(self) -> list[Instance]:
        """Instances that can take a delivery or run a sweep: alive and not frozen."""
        return [instance for instance in self.instances if instance.healthy]

    def deliver(self, instance: Instance, messages: Sequence[Message]) -> Run:
        """Push ``messages`` to ``instance`` as one batch; return when it ends or hangs."""
        run = Run(instance, list(messages))
        deliveries = [message.delivery(next(self._deliveries)) for message in messages]

        def body() -> None:
            self._local.run = run
            run.ident = threading.get_ident()
            with self._cond:
                self._by_thread[run.ident] = run
            try:
                run.results = instance.processor.run(deliveries)
            except Crash:
                run.crashed = True
            except BaseException as exc:  # the escape the ledger reports
                run.error = exc
            finally:
                with self._cond:
                    run.done = True
                    self._cond.notify_all()

        run.thread = threading.Thread(target=body, name=f"model-run-{instance.slot}",
                                      daemon=True)
        with self._cond:
            self._runs.append(run)
        run.thread.start()
        self._wait(run)
        return run

    def release(self, hang: Hang) -> None:
        """Let a hung handler go on; return when its run ends or hangs again."""
        self.hangs.remove(hang)
        hang.event.set()
        self._wait(hang.run, hang)

    def advance(self, seconds: float) -> None:
        """Move the store's clock; live instances renew their leases on the way, as they do."""
        left = seconds
        while left > 0:
            step = min(BEAT_SECONDS, left) if self._runs else left
            self.backend.advance(step)
            left -= step
            for instance in self.instances:
                if instance.healthy:
                    with _dies():
                        instance.processor.heartbeat.beat()
        self.bury()

    def freeze(self, instance: Instance) -> None:
        """Stop ``instance`` (no heartbeat, no step) until ``thaw``: a GC pause, a stopped VM."""
        instance.frozen = True
        self.ledger.frozen(instance.slot)

    def restart(self, instance: Instance) -> Instance:
        """Start a new process in a dead instance's place (same clock offset)."""
        fresh = self._instance(instance.slot, instance.clock.offset)
        self.instances[instance.slot] = fresh
        return fresh

    def redrive(self, instance: Instance) -> None:
        """One pass of the redrive sweeper on ``instance``."""
        with _dies():
            instance.redriver(self.broker).sweep()
        self.bury()

    def relay_sweep(self, instance: Instance) -> None:
        """One pass of the outbox sweeper on ``instance`` (entries older than a second)."""
        with _dies():
            instance.relay(self.broker).sweep(timedelta(seconds=1))
        self.bury()

    def replay(self, instance: Instance, record: Mapping[str, Any]) -> str:
        """An operator replays a FAILED ``record`` from ``instance``; return the outcome."""
        replayer = Replayer(cast(EventStore, instance.store), self.broker, instance.clock,
                            by="model", why="the model replays it",
                            locate=instance.processor.locate)
        outcome = "crashed"
        with _dies():
            outcome = replayer.replay(record).outcome
        self.bury()
        return outcome

    # -- hand-offs -----------------------------------------------------------------
    def _wait(self, run: Run, released: Hang | None = None) -> None:
        with self._cond:
            settled = self._cond.wait_for(
                lambda: run.done or (run.blocked is not None and run.blocked is not released),
                timeout=WAIT)
        if not settled:
            raise AssertionError(f"instance {run.instance.slot}'s run neither ended nor hung "
                                 f"within {WAIT:g} s: a real wait or a deadlock")
        self.bury()

    def _hang(self, label: str) -> None:
        """Block this handler until the world releases it (or its instance dies)."""
        run: Run = self._local.run
        hang = Hang(run, label)
        with self._cond:
            self.hangs.append(hang)
            run.blocked = hang
            self._cond.notify_all()
        if not hang.event.wait(WAIT):
            raise RuntimeError(f"{label} was never released")
        with self._cond:
            run.blocked = None
        if run.instance.dead:
            raise Crash(f"instance {run.instance.slot} died while {label} hung")

    def bury(self) -> None:
        """Deal with what ended: finished runs, and instances that died."""
        for _ in range(len(self._runs) + len(self.instances) + 1):
            self._reap()
            dead = [i for i in self.instances if i.dead and not i.buried]
            if not dead:
                return
            for instance in dead:
                instance.buried = True
                self.ledger.died(instance.slot, self.backend.now())
                for hang in [h for h in self.hangs if h.run.instance is instance]:
                    self.release(hang)

    def _reap(self) -> None:
        with self._cond:
            done = [run for run in self._runs if run.done]
            self._runs = [run for run in self._runs if not run.done]
        for run in done:
            assert run.thread is not None
            run.thread.join()
            self.ledger.run_over(run.instance.slot, run.ident)
            if run.error is not None:
                self.ledger.violate(Escaped, f"Processor.run on instance {run.instance.slot} "
                                                f"raised {type(run.error).__name__}: {run.error}")
            answered: set[str] = set()
            for message, result in zip(run.messages, run.results or (), strict=False):
                message.acked |= result.outcome.acked
                if result.key not in answered:  # a second copy in the batch follows the first
                    answered.add(result.key)
                    self.ledger.answered(result.key, result.outcome, result.key in run.claimed)
            for message in run.messages:
                message.delivered = True
            with self._cond:
                self._by_thread.pop(run.ident, None)

    # -- what the store calls say ----------------------------------------------------
    def _observe(self, slot: int, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 result: Any) -> None:
        instance = self.instances[slot]
        run = self._by_thread.get(threading.get_ident())
        thread = run.ident if run is not None else 0
        if name == "claim_many" and isinstance(result, BatchClaim):
            for key, claim in result.taken.items():
                self.ledger.claimed(key, claim.owner, slot, thread, instance.healthy)
                if run is not None:
                    run.claimed.add(key)
            self._held(result.holds, slot, thread, instance.healthy)
        elif name == "take_entities" and isinstance(result, EntityHolds):
            self._held(result, slot, thread, instance.healthy)
        elif name == "finish_many" and isinstance(result, Finished):
            finishes: Sequence[Finish] = args[0]
            for finish in finishes:
                self.ledger.let_go(finish.key, finish.owner)
            for release in (args[2] if len(args) > 2 else kwargs.get("releases", ())):
                self.ledger.let_go(release.entity_key, release.owner, entity=True)
        elif name == "guard_finish" and kwargs.get("succeeded"):
            self.ledger.recorded(str(args[0]))
        elif name == "claim" and isinstance(result, Claim):
            self.ledger.claimed(str(args[0]), result.owner, slot, thread, instance.healthy)
            if run is not None:
                run.claimed.add(str(args[0]))
        elif name == "mark_redriven" and result:
            key = str(args[0])
            self.ledger.touched(key, slot, "redrove")
            record = self.store.get(key) or {}
            self.ledger.redriven(key, str(record.get("event_status")), is_parked(record))
        elif name == "abandon" and result:
            self.ledger.touched(str(args[0]), slot, "gave up")
        elif name == "record_replay" and result is not None and kwargs.get("reopen"):
            self.ledger.replayed(str(args[0]))

    def _held(self, holds: EntityHolds | None, slot: int, thread: int, healthy: bool) -> None:
        for entity in (holds.records if holds is not None else {}):
            assert holds is not None
            if holds.held(entity):
                self.ledger.held(entity, holds.owner_of(entity), slot, thread, healthy)

    # -- handlers --------------------------------------------------------------------
    def _handle(self, context: Context, partner: str, guard: str) -> None:
        run: Run = self._local.run
        entity, position = self.ledger.ordered.get(context.key, ("", None))
        handler = HandlerRun(context.key, run.instance.slot, entity, position)
        self.ledger.run_started(handler, self.store.get_many)
        try:
            if partner:
                context.guard.run(guard, lambda: self._call(context, partner, guard))
            else:
                self._behave(context.key)
        except PartnerPaused:
            handler.parked = True
            raise
        finally:
            self.ledger.run_ended(handler)

    def _call(self, context: Context, partner: str, guard: str) -> dict[str, Any]:
        try:
            return context.partner(partner).call(lambda: self._effect(context.key, partner,
                                                                      guard))
        except BreakerOpen as exc:
            if exc.__cause__ is None:  # refused; not the failure that opened it
                self.ledger.refused(partner_name(partner), "breaker", self.backend.now())
            raise
        except RateLimited:
            self.ledger.refused(partner_name(partner), "rate", self.backend.now())
            raise

    def _effect(self, key: str, partner: str, guard: str) -> dict[str, Any]:
        run: Run = self._local.run
        invocation = Invocation(guard, partner, run.instance.slot, self.backend.now())
        self.ledger.invoked(invocation)
        try:
            self._behave(key)
        except ConnectionError:
            self.ledger.effect_ended(invocation, "raised", self.backend.now(), transient=True)
            raise
        except BaseException:
            self.ledger.effect_ended(invocation, "raised", self.backend.now())
            raise
        self.ledger.effect_ended(invocation, "ok", self.backend.now())
        return {"effect": guard}

    def _behave(self, key: str) -> None:
        plan = self.plans.get(key) or []
        behaviour = "pass" if self.settling or not plan else plan.pop(0)
        if behaviour == "hang":
            self._hang(f"{key}'s handler")
        elif behaviour == "transient":
            raise ConnectionError(f"{key}: the partner is down (the model's plan)")
        elif behaviour == "permanent":
            raise PermanentError(f"{key}: the partner refused it (the model's plan)")

    # -- checking --------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Every event key the world knows: its messages' and their outboxes' children."""
        return sorted({message.key for message in self.messages})

    def check(self) -> None:
        """After a step: what the store holds against the ledger; raise the first violation."""
        records = {str(r["idempotency_key"]): r for r in self.store.get_many(self.keys())}
        entities = sorted({entity for entity, _ in self.ledger.ordered.values()})
        held = {str(r["idempotency_key"]): r for r in self.store.get_many(entities)}
        self.ledger.observe(records, held)
        self.ledger.raise_first()

    def settle(self) -> None:
        """End the run as a deployment would, then check that nothing was lost.

        Every frozen instance resumes, every hang ends (handlers pass from
        now on), dead instances restart, and what the broker still holds is
        delivered once more: each message never delivered, or never acked and
        with no record (only the broker has it). Pub/Sub then stops
        redelivering (its retention ran out): only the store brings events
        back. Rounds of: time moves past every lease and delay, each instance
        runs its redrive and outbox sweeps, and what they publish is delivered
        (and what that publishes, children); until a round moves nothing.
        Then nothing may be PROCESSING or PENDING, a retryable record must
        have a redrive due, and every child of a SUCCESS must be published and
        stored.
        """
        self.settling = True
        for instance in self.instances:
            instance.frozen = False
            instance.store.armed = None
        while self.hangs:
            self.release(self.hangs[0])
        self.bury()
        for instance in list(self.instances):
            if instance.dead:
                self.restart(instance)
        # What no answer acked and no record holds is still the broker's: it comes once more.
        stored = {str(r["idempotency_key"]) for r in self.store.get_many(self.keys())}
        pending = [message for message in self.messages if not message.acked
                   and (not message.delivered or message.key not in stored)]
        self.fresh.clear()
        self._deliver_each(pending)
        self._deliver_fresh()
        for _ in range(12):
            self.advance(700)
            moved = 0
            for instance in self.eligible():
                moved += instance.redriver(self.broker).sweep().republished
                moved += instance.relay(self.broker).sweep(timedelta(seconds=1)).published
            delivered = self._deliver_fresh()
            self.check()
            if not moved and not delivered:
                break
        self._finally_stored()
        self.ledger.raise_first()

    def _deliver_fresh(self) -> int:
        """Deliver what was published, and what that publishes (children), until none is left."""
        delivered = 0
        while self.fresh:
            fresh, self.fresh = self.fresh, []
            self._deliver_each(fresh)
            delivered += len(fresh)
        return delivered

    def _deliver_each(self, messages: Sequence[Message]) -> None:
        for index, message in enumerate(messages):
            instances = self.eligible()
            self.deliver(instances[index % len(instances)], [message])

    def _finally_stored(self) -> None:
        records = {str(r["idempotency_key"]): r for r in self.store.get_many(self.keys())}
        for key, record in sorted(records.items()):
            status = record.get("event_status")
            if status in ("PROCESSING", "PENDING"):
                self.ledger.violate(Lost, f"{key} is left {status} after every lease ran out and "
                                          "every sweep ran: nothing will finish it")
            elif status == "FAILED" and record.get("retryable") is True and \
                    not isinstance(record.get("redrive_at"), datetime):
                self.ledger.violate(Lost, f"{key} is FAILED and retryable with no redrive due")
            for entry in record.get("outbox") or () if status == "SUCCESS" else ():
                child = str(entry.get("idempotency_key"))
                if "topic" in entry:
                    continue
                if entry.get("status") != "PUBLISHED" or child not in records:
                    self.ledger.violate(Lost, f"{key}'s child {child} is {entry.get('status')} "
                                              f"and {'stored' if child in records else 'absent'}")

    def close(self) -> None:
        """Let every thread end (a dead process's hangs end at once)."""
        for instance in self.instances:
            instance.store.dead = True
        while self.hangs:
            hang = self.hangs.pop()
            hang.event.set()
        for run in list(self._runs):
            if run.thread is not None:
                run.thread.join(WAIT)


# -- helpers ---------------------------------------------------------------------------
class _Dies:
    """Context manager: a ``Crash`` in a machine-thread call kills the instance, not the step."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, Crash)


def _dies() -> _Dies:
    return _Dies()


def _unreadable(event: Event) -> Event:
    """The ``v0`` upcaster: it cannot read the event (a bug in route code)."""
    raise ValueError(f"cannot upcast {event.event_type} {event.event_version}")


def _event(event_type: str, partner: str, entity_id: str, entity_type: str,
           data: Mapping[str, Any], version: str = "v1") -> bytes:
    body = {"event_type": event_type, "event_version": version, "event_direction": "IN",
            "entity_metadata": {"partnerId": partner, "partnerName": partner,
                                "entity_id": entity_id, "entity_type": entity_type},
            "entity_data": dict(data)}
    return json.dumps(body).encode()


def _message_key(data: bytes, attributes: Mapping[str, str]) -> str:
    """The key a message is stored under: a child's own key, else the publisher's, scoped."""
    if attributes.get("parent_key"):
        return attributes["idempotency_key"]
    return record_key(parse_event(data, attributes), attributes)
