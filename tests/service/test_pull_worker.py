"""The pull worker with a fake subscriber, on the in-memory store: batches decided as push decides.

``FakeMessage`` records its ack or nack; ``setup()`` builds the real
``PullWorker`` over a real ``Processor`` (batches of N) with a test router. Time is a fake clock:
the rate limit is checked without sleeping.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.model.context import Context
from eventbus.model.errors import PermanentError, StoreUnavailable
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.workers.pull import Inbox, PullWorker
from eventbus.workers.rate import RateLimit
from tests.closing import closed_after_test, closed_here
from tests.hypothesis_profiles import examples

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
ENTITY = {"partnerId": "p1", "entity_id": "e-1", "entity_type": "Order"}


@dataclasses.dataclass
class FakeMessage:
    """What google-cloud-pubsub hands the callback, recording the answer."""

    data: bytes
    attributes: dict[str, str]
    message_id: str
    ordering_key: str = ""
    delivery_attempt: int | None = 1
    answer: str = ""
    ack_error: Exception | None = None

    def ack(self) -> None:
        self.answer += "ack"

    def nack(self) -> None:
        self.answer += "nack"

    def ack_with_response(self) -> Any:
        self.answer += "ack"
        error = self.ack_error

        class Future:
            def result(self) -> None:
                if error is not None:
                    raise error

        return Future()


def message(n: int, event_type: str = "TEST", key: str | None = None, **data: Any) -> FakeMessage:
    body = {"event_type": event_type, "event_version": "v1", "entity_metadata": ENTITY,
            "entity_data": {"n": n, **data}}
    return FakeMessage(json.dumps(body).encode(), {"idempotency_key": key or f"k-{n}"}, f"m-{n}")


@dataclasses.dataclass
class Setup:
    store: MemoryEventStore
    worker: PullWorker
    calls: list[Context]
    relayed: list[tuple[str, str]]
    clock: FakeClock


def setup(behaviour: Callable[[Context], None] | None = None, *, store: Any = None,
          rate: RateLimit | None = None, exactly_once: bool = False) -> Setup:
    from eventbus.model.router import Router

    routes, calls, relayed = Router(), [], []

    @routes.handler("TEST")
    def handle(context: Context) -> None:
        calls.append(context)
        if behaviour is not None:
            behaviour(context)

    clock = FakeClock(NOW)
    store = store or MemoryEventStore(lease=dt.timedelta(seconds=30), clock=clock)

    def after_success(key: str, outbox: Any) -> None:  # the inline relay's place
        relayed.append((key, str((store.get(key) or {}).get("event_status"))))

    processor = closed_after_test(Processor(store, routes, Settings(max_attempts=5), clock,
                                            after_success=after_success, concurrency=4))
    worker = PullWorker(processor, Inbox(), subscription="projects/p/subscriptions/s-pull",
                        batch_size=100, rate=rate, exactly_once=exactly_once)
    return Setup(store, worker, calls, relayed, clock)


def test_one_failure_never_fails_the_batch() -> None:
    def behaviour(context: Context) -> None:
        n = context.event.entity_data["n"]
        if n == 2:
            raise ConnectionError("partner down")  # transient: nacked
        if n == 3:
            raise PermanentError("no such order")  # stored FAILED, acked
        if n == 4:
            context.emit("CHILD", {"of": n})

    s = setup(behaviour)
    poison = FakeMessage(b"{not json", {}, "m-poison")
    batch = [message(1), message(2), message(3), message(4), poison]
    results = s.worker.run_batch(batch)
    assert [m.answer for m in batch] == ["ack", "nack", "ack", "ack", "ack"]
    assert [r.outcome.value for r in results] == ["processed", "retry", "rejected",
                                                   "processed", "rejected"]
    statuses = {r.key: (s.store.get(r.key) or {}).get("event_status") for r in results}
    assert list(statuses.values()) == ["SUCCESS", "FAILED", "FAILED", "SUCCESS", "FAILED"]
    # The child is relayed only once its parent is stored SUCCESS.
    assert s.relayed == [(results[3].key, "SUCCESS")]


def test_a_hook_that_takes_a_batch_gets_every_parent_of_it_at_once() -> None:
    class BatchHook:
        """An ``after_success`` with ``relay_many`` and ``close`` (the inline relay's shape)."""

        def __init__(self) -> None:
            self.calls: list[list[tuple[str, str, int]]] = []
            self.closed = False

        def close(self) -> None:
            self.closed = True

        def __call__(self, key: str, outbox: Any) -> None:
            self.calls.append([(key, "", len(outbox))])

        def relay_many(self, outboxes: Any) -> None:
            self.calls.append([(key, str((store.get(key) or {}).get("event_status")),
                                len(outbox)) for key, outbox in outboxes])

    from eventbus.model.router import Router

    routes, store, hook = Router(), MemoryEventStore(lease=dt.timedelta(seconds=30)), BatchHook()
    routes.handler("TEST")(lambda context: context.emit("CHILD", {"of": 1})
                           if context.event.entity_data["n"] != 2 else None)
    worker = PullWorker(Processor(store, routes, Settings(), FakeClock(NOW),
                                  after_success=hook, concurrency=4),
                        Inbox(), subscription="projects/p/subscriptions/s-pull")
    results = worker.run_batch([message(1), message(2), message(3)])
    # One call for the batch, parents with children only, each stored SUCCESS first.
    assert hook.calls == [[(results[0].key, "SUCCESS", 1), (results[2].key, "SUCCESS", 1)]]
    results = worker.run_batch([message(4)])  # one parent: the per-parent hook
    assert hook.calls[1:] == [[(results[0].key, "", 1)]]
    assert not hook.closed
    worker.processor.close()  # the worker's end stops the hook's threads too
    assert hook.closed


def test_duplicates_in_and_across_batches_run_once() -> None:
    s = setup()
    first = [message(1), message(1), message(2)]
    first[1].message_id = "m-1-again"
    s.worker.run_batch(first)
    again = [message(1), message(2)]
    results = s.worker.run_batch(again)
    assert [m.answer for m in first + again] == ["ack"] * 5
    assert [r.outcome.value for r in results] == ["duplicate", "duplicate"]
    assert sorted(c.event.entity_data["n"] for c in s.calls) == [1, 2]


def test_a_lease_lost_during_the_batch_is_nacked_not_acked() -> None:
    holder: list[Setup] = []

    def steal(context: Context) -> None:  # another worker takes the lease meanwhile
        store = holder[0].store
        # Its lease runs out on the store's clock and another worker claims it; the
        # clock then goes back, so only this key's lease is the one that lapsed.
        lapse = store.lease.total_seconds() + 1
        store.clock.advance(lapse)
        store.claim(context.key, {"payload_fingerprint": ""}, store.now())
        store.clock.advance(-lapse)

    s = setup(steal)
    holder.append(s)
    batch = [message(1)]
    [result] = s.worker.run_batch(batch)
    assert result.outcome.value == "lease_lost" and batch[0].answer == "nack"


class DownStore(MemoryEventStore):
    """A store that cannot be reached for batches."""

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("claim batch: ServerSelectionTimeoutError")


def test_a_store_outage_nacks_the_whole_batch_and_loses_nothing() -> None:
    s = setup(store=DownStore())
    batch = [message(1), message(2)]
    results = s.worker.run_batch(batch)
    assert [m.answer for m in batch] == ["nack", "nack"] and s.calls == []
    assert {r.outcome.value for r in results} == {"unavailable"}


def test_a_message_over_the_size_limit_is_stored_failed_and_acked() -> None:
    s = setup()
    huge = message(1, blob="x" * (9 * 1024 * 1024))
    [result] = s.worker.run_batch([huge])
    assert huge.answer == "ack" and result.outcome.value == "rejected" and s.calls == []
    assert (s.store.get(result.key) or {})["event_status"] == "FAILED"


def test_the_rate_limit_is_honoured_without_sleeping() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    rate = RateLimit(50, monotonic=lambda: clock[0], sleep=sleep)
    s = setup(rate=rate)
    for n in range(3):
        s.worker.run_batch([message(100 * n + i) for i in range(50)])
    # 150 events at 50/s: the first 50 ride the initial second, the next two batches wait.
    assert slept == pytest.approx([1.0, 1.0])
    assert len(s.calls) == 150


def test_a_failed_exactly_once_ack_is_counted_not_retried() -> None:
    s = setup(exactly_once=True)
    batch = [message(1), message(2)]
    batch[0].ack_error = RuntimeError("AcknowledgeError: PERMISSION_DENIED")
    s.worker.run_batch(batch)
    assert [m.answer for m in batch] == ["ack", "ack"]  # one try each
    assert s.worker.counters.failed_acks == 1 and s.worker.counters.acked == 2


def test_stop_finishes_the_batch_in_flight_and_nacks_the_rest() -> None:
    started, release = threading.Event(), threading.Event()

    def slow(context: Context) -> None:
        started.set()
        release.wait(5)

    s = setup(slow)
    s.worker.batch_size = 2
    messages = [message(n) for n in range(5)]
    for m in messages:
        s.worker.inbox.put(m)
    runner = threading.Thread(target=s.worker.run)
    runner.start()
    assert started.wait(5)
    s.worker.stop()
    release.set()
    runner.join(10)
    assert not runner.is_alive()
    assert [m.answer for m in messages[:2]] == ["ack", "ack"]  # the batch in flight
    assert [m.answer for m in messages[2:]] == ["nack"] * 3  # queued, never started
    assert s.worker.counters.batches == 1


HOSTILE_TEXT = st.text(max_size=30) | st.sampled_from(["\ud800", "a\x00b", "\udfff"])
HOSTILE_VALUE = st.recursive(
    st.none() | st.booleans() | HOSTILE_TEXT | st.integers(-(2**80), 2**80) | st.floats(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
    max_leaves=10)


def hostile_body(value: Any, depth: int, wide: int) -> bytes:
    inner = json.dumps({"v": value, "wide": [0] * wide})
    data = '{"d":' * depth + inner + "}" * depth  # deeper than json.dumps could write
    head = json.dumps({"event_type": "TEST", "event_version": "v1", "entity_metadata": ENTITY})
    return (head[:-1] + ', "entity_data": ' + data + "}").encode("utf-8", "surrogatepass")


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=HOSTILE_VALUE, depth=st.sampled_from([0, 5, 200, 5000]),
       wide=st.sampled_from([0, 10, 200_000]),
       raw=st.binary(max_size=40), key=HOSTILE_TEXT)
def test_whatever_a_batch_holds_every_message_is_answered_and_none_is_lost(
        value: Any, depth: int, wide: int, raw: bytes, key: str) -> None:
    s = setup()
    batch = [FakeMessage(hostile_body(value, depth, wide), {"idempotency_key": key}, "m-1"),
             FakeMessage(raw, {"idempotency_key": key, "event_type": "TEST"}, "m-2"),
             FakeMessage(b"\xff\xfe" + raw, {}, "m-3"), message(9)]
    with closed_here(s.worker.processor):  # each example's threads end with it
        results = s.worker.run_batch(batch)
    for m, result in zip(batch, results, strict=True):
        assert m.answer in ("ack", "nack")
        if m.answer == "ack":  # acked: its record exists (stored, or a duplicate of one)
            assert s.store.get(result.key) is not None, (m, result)
        else:
            assert result.outcome.value in ("retry", "unavailable", "in_progress")
    assert batch[-1].answer == "ack"


def mixed_router(store_of: Callable[[], MemoryEventStore]) -> Any:
    from eventbus.model.router import Router

    routes = Router()

    @routes.handler("TEST")
    def handle(context: Context) -> None:
        n = context.event.entity_data["n"]
        if n == 1:
            context.emit("CHILD", {"of": n})
        elif n == 5:
            raise ConnectionError("partner down")  # transient
        elif n == 6:
            raise PermanentError("no such order")
        elif n == 7:  # another worker takes the lease meanwhile
            store = store_of()  # as in test_a_lease_lost_during_the_batch_is_nacked_not_acked
            lapse = store.lease.total_seconds() + 1
            store.clock.advance(lapse)
            store.claim(context.key, {"payload_fingerprint": ""}, store.now())
            store.clock.advance(-lapse)

    routes.handler("CHILD", internal=True)(lambda context: None)
    return routes


def mixed_batch() -> list[FakeMessage]:
    conflicting = message(3, changed=True)  # the key k-3, another payload
    return [message(1), message(2), conflicting, FakeMessage(b"{not json", {}, "m-poison"),
            message(5), message(6), message(7), message(1), message(8)]


def run_mixed(as_batch: bool) -> tuple[list[str], list[str]]:
    stores: list[MemoryEventStore] = []
    clock = FakeClock(NOW)
    store = MemoryEventStore(lease=dt.timedelta(seconds=30), clock=clock)
    stores.append(store)
    processor = closed_after_test(Processor(store, mixed_router(lambda: stores[0]),
                                            Settings(max_attempts=5), clock, concurrency=3))
    worker = PullWorker(processor, Inbox(), subscription="s")
    for earlier in (message(2), message(3)):  # a duplicate and a taken key, stored before
        processor.process(worker.delivery(earlier))
    deliveries = [worker.delivery(m) for m in mixed_batch()]
    results = processor.run(deliveries) if as_batch else [processor.process(d)
                                                          for d in deliveries]
    statuses = [str((store.get(r.key) or {}).get("event_status")) for r in results]
    return [r.outcome.value for r in results], statuses


def test_a_batch_of_mixed_outcomes_gives_each_message_what_push_gives_it_alone() -> None:
    alone, batch = run_mixed(as_batch=False), run_mixed(as_batch=True)
    assert batch == alone
    assert batch[0] == ["processed", "duplicate", "conflict", "rejected", "retry", "rejected",
                        "lease_lost", "duplicate", "processed"]
    assert batch[1][:7] == ["SUCCESS", "SUCCESS", "SUCCESS", "FAILED", "FAILED", "FAILED",
                            "PROCESSING"]


class FinishDownStore(MemoryEventStore):
    """Claims work; storing outcomes does not (the store went away mid-batch)."""

    def finish_many(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("finish batch: ServerSelectionTimeoutError")


@pytest.mark.parametrize("as_batch", [False, True])
def test_a_store_that_fails_at_finish_leaves_the_claimed_events_unavailable(
        as_batch: bool) -> None:
    s = setup(store=FinishDownStore(lease=dt.timedelta(seconds=30)))
    poison = FakeMessage(b"{not json", {}, "m-poison")
    batch = [message(1), message(2), poison]
    deliveries = [s.worker.delivery(m) for m in batch]
    processor = s.worker.processor
    results = processor.run(deliveries) if as_batch else [processor.process(d)
                                                          for d in deliveries]
    assert [r.outcome.value for r in results] == ["unavailable", "unavailable", "rejected"]
    assert s.relayed == []  # nothing relayed for an outcome that was never stored
    keys = [processor.locate(d).key for d in deliveries[:2]]
    assert [(s.store.get(key) or {}).get("event_status") for key in keys] == [
        "PROCESSING", "PROCESSING"]  # the lease runs out; redelivery or the redrive finishes


WORKER_WITHOUT_FLASK = """
import sys
from eventbus import create_worker
from eventbus.ops.commands.common import load_app
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.workers.command import router_of

router = router_of("handlers:create_router", load_app)
worker = create_worker(router, Settings(), store=MemoryEventStore(), subscription="s")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("flask", "werkzeug"))
assert loaded == [], loaded
assert "eventbus.web" not in sys.modules, "the worker built a web layer"
print(type(worker.processor).__name__, len(worker.processor.router.event_types()))
"""


def test_a_worker_process_never_imports_flask() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", WORKER_WITHOUT_FLASK], capture_output=True,
                          text=True, cwd=root, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    name, types = done.stdout.split()
    assert name == "Processor" and int(types) > 3  # the partner app's routes are all there


def test_create_worker_ensures_the_indexes_as_the_app_does() -> None:
    # The batch claim tells a new key from a taken one by the key's unique index.
    from eventbus import create_worker
    from eventbus.model.router import Router

    class Recording(MemoryEventStore):
        ensured = 0

        def ensure_indexes(self) -> None:
            self.ensured += 1

    store = Recording()
    worker = create_worker(Router(), Settings(), store=store, subscription="s")
    assert store.ensured == 1 and worker.processor.store is store
