"""Route code that runs outside the handler never escapes: each failure is stored and answered.

A route's own code runs in three places besides its handler: its upcasters
(before the claim on an ordered route, to read the position), the read of
its ``ordered_by`` position, and its forwards' mappings (after the handler,
to build the public bodies). Whatever any of them raises, the delivery gets
a stored record and an answer: push never answers an internal error, the
pull worker never stops, and the message is never lost. An upcaster's or a
position read's exception is the handler's input failing, so it is
classified as the handler's own exception would be (permanent: FAILED for
good and acked; anything else: FAILED-retryable, redelivered, FAILED for
good at the attempt cap); a forward's mapping runs after the handler's
effect, so it fails the forward (a FAILED outbox entry), never the event.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import contract, path
from eventbus.model.context import Context
from eventbus.model.errors import (
    InvalidEvent,
    PermanentError,
    TransientError,
    UnsupportedVersion,
)
from eventbus.model.event import Event
from eventbus.model.order import entity_key
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.workers.pull import Inbox, PullWorker
from tests.closing import closed_after_test
from tests.hypothesis_profiles import examples
from tests.service.conftest import START, Make
from tests.service.test_pull_worker import FakeMessage

ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "o-1",
          "entity_type": "Order"}


class NoSuchStatus(PermanentError):
    """A permanent failure an upcaster raises on purpose."""


class Unprintable(Exception):
    """An exception whose message cannot even be made: ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


def order_event(ts: Any, version: str = "v1", entity: dict[str, str] = ENTITY,
                **data: Any) -> dict[str, Any]:
    return {"event_type": "ORD", "event_version": version, "entity_metadata": entity,
            "entity_data": {"ts": ts, **data}}


def ordered_router(upcaster: Callable[[Event], Event], calls: list[Any]) -> Router:
    """An ordered route reading v2, whose v1 events go through ``upcaster`` first."""
    routes = Router()

    @routes.handler("ORD", versions=("v2",), upcasters={"v1": upcaster},
                    ordered_by="entity_data.ts")
    def handle(context: Context) -> None:
        calls.append(context.event.entity_data["ts"])

    return routes


def raising_on(bad: Any, exc: Exception) -> Callable[[Event], Event]:
    """An upcaster that raises ``exc`` for the event at position ``bad``, else upcasts."""
    def upcast(event: Event) -> Event:
        if event.entity_data.get("ts") == bad:
            raise exc
        return event.with_version("v2", dict(event.entity_data))
    return upcast


class RaisingData(dict[str, Any]):
    """Event data whose reads raise: the ``ordered_by`` position cannot be read."""

    error: Exception = RuntimeError("unset")

    def get(self, key: str, default: Any = None) -> Any:
        raise self.error

    def __getitem__(self, key: str) -> Any:
        raise self.error


def unreadable_position(exc: Exception) -> Callable[[Event], Event]:
    """An upcaster whose event's position read raises ``exc``."""
    def upcast(event: Event) -> Event:
        data = RaisingData(event.entity_data)
        data.error = exc
        return event.with_version("v2", data)
    return upcast


def record_of(store: MemoryEventStore, key: str) -> dict[str, Any]:
    found = store.get(key)
    assert found is not None, f"no record under {key}"
    return dict(found)


# -- push: the upcaster of an ordered route ------------------------------------------------------

def test_an_ordered_routes_upcaster_that_raises_is_retried_then_failed_for_good(
        make_harness: Make) -> None:
    calls: list[Any] = []
    h = make_harness(router=ordered_router(raising_on(2, KeyError("orderStatus")), calls),
                     max_attempts=2)
    first = h.push(order_event(2), idempotency_key="bad")
    # Not known to be permanent: the handler's transient failure (503, redelivered).
    assert (first.status_code, first.json["outcome"]) == (503, "retry")
    stored = record_of(h.store, "p:p1:bad")
    assert (stored["event_status"], stored["retryable"]) == ("FAILED", True)
    assert stored["error"]["type"] == "KeyError"
    assert "orderStatus" in stored["error"]["message"]
    assert stored["redrive_at"] is not None
    h.clock.advance(10)
    second = h.push(order_event(2), "m-2", idempotency_key="bad")
    # Bounded: at the attempt cap it is FAILED for good and acked.
    assert (second.status_code, second.json["outcome"]) == (200, "rejected")
    stored = record_of(h.store, "p:p1:bad")
    assert (stored["event_status"], stored["retryable"]) == ("FAILED", False)
    assert stored["error"]["classification"] == "attempt_cap"
    assert calls == []  # the handler never ran for it
    # The entity was never held for it: a later event of the entity runs at once.
    later = h.push(order_event(3), "m-3", idempotency_key="good")
    assert (later.status_code, later.json["outcome"]) == (200, "processed")
    assert calls == [3]


def test_an_ordered_routes_upcaster_that_raises_permanent_is_failed_for_good_and_acked(
        make_harness: Make) -> None:
    calls: list[Any] = []
    h = make_harness(router=ordered_router(raising_on(2, NoSuchStatus("OR_ZZZ")), calls))
    answer = h.push(order_event(2), idempotency_key="bad")
    assert (answer.status_code, answer.json["outcome"]) == (200, "rejected")
    stored = record_of(h.store, "p:p1:bad")
    assert (stored["event_status"], stored["retryable"]) == ("FAILED", False)
    assert (stored["error"]["type"], stored["error"]["message"]) == ("NoSuchStatus", "OR_ZZZ")
    assert stored["error"]["classification"] == "permanent"
    assert h.push(order_event(2), "m-2", idempotency_key="bad").json["outcome"] == "duplicate"
    assert calls == []


def test_an_upcaster_that_returns_no_event_is_a_stored_failure(make_harness: Make) -> None:
    calls: list[Any] = []
    h = make_harness(router=ordered_router(lambda event: None, calls))  # type: ignore[arg-type,return-value]
    answer = h.push(order_event(1), idempotency_key="none")
    assert (answer.status_code, answer.json["outcome"]) == (503, "retry")
    stored = record_of(h.store, "p:p1:none")
    assert stored["event_status"] == "FAILED" and stored["error"]["type"] == "TypeError"
    assert "not an Event" in stored["error"]["message"]
    assert calls == []


# -- push: the position read ---------------------------------------------------------------------

@pytest.mark.parametrize(("error", "status", "outcome", "retryable"), [
    (NoSuchStatus("ts is gone"), 200, "rejected", False),
    (LookupError("ts is gone"), 503, "retry", True),
])
def test_a_position_read_that_raises_is_a_stored_failure(
        make_harness: Make, error: Exception, status: int, outcome: str,
        retryable: bool) -> None:
    calls: list[Any] = []
    h = make_harness(router=ordered_router(unreadable_position(error), calls))
    answer = h.push(order_event(1), idempotency_key="unread")
    assert (answer.status_code, answer.json["outcome"]) == (status, outcome)
    stored = record_of(h.store, "p:p1:unread")
    assert (stored["event_status"], stored["retryable"]) == ("FAILED", retryable)
    assert (stored["error"]["type"], stored["error"]["message"]) == \
        (type(error).__name__, "ts is gone")
    assert calls == []
    # Nothing of the entity was touched: no record of it.
    assert h.store.get(entity_key("p1", "Order", "o-1")) is None


class Touchy(int):
    """A position an upcaster made that refuses to be compared."""

    def __lt__(self, other: object) -> bool:
        raise MappingBroke("no comparing")

    __gt__ = __le__ = __ge__ = __eq__ = __lt__
    __hash__ = int.__hash__


def test_a_position_of_an_upcasters_own_type_is_read_as_a_plain_number() -> None:
    # The stages after the read (a lane's sort, the comparison with the applied
    # position, the entity's record) never run code of the event's.
    calls: list[Any] = []
    routes = ordered_router(lambda event: event.with_version(
        "v2", {**event.entity_data, "ts": Touchy(event.entity_data["ts"])}), calls)
    store = MemoryEventStore(lease=dt.timedelta(seconds=30))
    processor = closed_after_test(Processor(store, routes, Settings(), FakeClock(START),
                                            concurrency=2))
    worker = PullWorker(processor, Inbox(), subscription="projects/p/subscriptions/s-pull")
    results = processor.run([worker.delivery(pulled(n, f"t{n}")) for n in (2, 1, 3)])
    assert [r.outcome.value for r in results] == ["processed"] * 3
    assert [int.__int__(ts) for ts in calls] == [1, 2, 3]  # in position order
    entity = store.get(entity_key("p1", "Order", "o-1")) or {}
    assert entity["position"] == 3 and type(entity["position"]) is int


# -- push: a forward's mapping -------------------------------------------------------------------

@contract("ord-state", "v1")
@dataclasses.dataclass(frozen=True)
class OrdState:
    """An order's public state."""

    order_id: str
    name: str


class MappingBroke(Exception):
    """Raised by a forward's conversion of a value."""


def broken_upper(value: Any) -> str:
    if value == "boom":
        raise MappingBroke("cannot map boom")
    return str(value.upper())  # an int has no upper(): AttributeError


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize(("name", "error"), [(7, "AttributeError: 'int' object"),
                                             ("boom", "MappingBroke: cannot map boom")],
                         ids=["builtin", "own"])
def test_a_forward_mapping_that_raises_fails_the_forward_not_the_event(
        make_harness: Make, ordered: bool, name: Any, error: str) -> None:
    calls: list[Any] = []
    routes = Router()

    @routes.handler("ORD", versions=("v1",), ordered_by="entity_data.ts" if ordered else None)
    def handle(context: Context) -> None:
        calls.append(context.event.entity_data["ts"])

    routes.forward("ORD", topic="ord-state", contract=OrdState,
                   fields={"order_id": "entity_metadata.entity_id",
                           "name": path("entity_data.name", broken_upper)})
    h = make_harness(router=routes)
    answer = h.push(order_event(1, "v1", name=name), idempotency_key="fwd")
    # The handler's effect is done: the event is SUCCESS (acked), its forward FAILED.
    assert (answer.status_code, answer.json["outcome"]) == (200, "processed")
    stored = record_of(h.store, "p:p1:fwd")
    assert stored["event_status"] == "SUCCESS"
    (entry,) = stored["outbox"]
    assert (entry["kind"], entry["status"]) == ("public", "FAILED")
    assert "body" not in entry  # never published half-built
    # The value does not fit the mapping: a contract violation saying what the mapping raised.
    assert entry["error"]["type"] == "ContractViolation"
    assert entry["error"]["classification"] == "permanent"
    assert entry["error"]["message"].startswith(f"entity_data.name: {error}")
    assert calls == [1]
    again = h.push(order_event(1, "v1", name=name), "m-2", idempotency_key="fwd")
    assert again.json["outcome"] == "duplicate" and calls == [1]  # the effect once


def test_a_forward_condition_that_raises_fails_the_forward_not_the_event(
        make_harness: Make) -> None:
    class Hostile:
        """A value an upcaster put in the event, which refuses to be compared."""

        def __eq__(self, other: object) -> bool:
            raise MappingBroke("no comparing")

        __hash__ = object.__hash__

    routes = Router()
    routes.handler("ORD", versions=("v2",), upcasters={
        "v1": lambda event: event.with_version("v2", {**event.entity_data, "name": Hostile()})},
    )(lambda context: None)
    routes.forward("ORD", topic="ord-state", contract=OrdState,
                   fields={"order_id": "entity_metadata.entity_id", "name": "entity_data.name"},
                   when={"entity_data.name": ("a", "b")})
    h = make_harness(router=routes)
    answer = h.push(order_event(1), idempotency_key="when")
    assert (answer.status_code, answer.json["outcome"]) == (200, "processed")
    (entry,) = record_of(h.store, "p:p1:when")["outbox"]
    assert entry["status"] == "FAILED" and entry["error"]["type"] == "MappingBroke"


# -- the pull worker ---------------------------------------------------------------------------

def pulled(ts: Any, key: str, entity_id: str = "o-1", version: str = "v1") -> FakeMessage:
    body = order_event(ts, version, {**ENTITY, "entity_id": entity_id})
    return FakeMessage(json.dumps(body).encode(), {"idempotency_key": key}, f"m-{key}")


def test_an_upcaster_that_raises_in_a_batch_fails_only_its_message_and_the_worker_runs_on(
        ) -> None:
    calls: list[Any] = []

    def upcast(event: Event) -> Event:
        ts = event.entity_data["ts"]
        if ts == 2:
            raise NoSuchStatus("not an order status")
        if ts == 4:
            raise ConnectionError("lookup table down")
        return event.with_version("v2", dict(event.entity_data))

    store = MemoryEventStore(lease=dt.timedelta(seconds=30))
    processor = closed_after_test(Processor(store, ordered_router(upcast, calls),
                                            Settings(max_attempts=5), FakeClock(START),
                                            concurrency=4))
    worker = PullWorker(processor, Inbox(), subscription="projects/p/subscriptions/s-pull",
                        batch_size=5, batch_wait=0.01)
    # Two entities; the failing events sit between good ones of the same entity.
    batch = [pulled(1, "a1"), pulled(2, "a2"), pulled(3, "a3"), pulled(4, "b4", "o-2"),
             pulled(5, "b5", "o-2")]
    for m in batch:
        worker.inbox.put(m)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        _wait_for(lambda: all(m.answer for m in batch))
        assert [m.answer for m in batch] == ["ack", "ack", "ack", "nack", "ack"]
        assert sorted(calls) == [1, 3, 5]
        statuses = [(record_of(store, f"p:p1:{m.attributes['idempotency_key']}")
                     ["event_status"]) for m in batch]
        assert statuses == ["SUCCESS", "FAILED", "SUCCESS", "FAILED", "SUCCESS"]
        assert record_of(store, "p:p1:a2")["retryable"] is False
        assert record_of(store, "p:p1:b4")["retryable"] is True  # redelivered, never lost
        # The worker is still running: the next message is processed.
        after = pulled(6, "a6")
        worker.inbox.put(after)
        _wait_for(lambda: bool(after.answer))
        assert after.answer == "ack" and sorted(calls) == [1, 3, 5, 6]
        assert runner.is_alive()
    finally:
        worker.stop()
        runner.join(10)
    assert not runner.is_alive()


def _wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out: the worker answered nothing more")
        time.sleep(0.01)


# -- any exception, hostile messages -----------------------------------------------------------

HOSTILE_MESSAGES = st.text(max_size=40) | st.sampled_from(
    ["\ud800", "a\x00b", "\udfff" * 50, "x" * 1_000_000, "\x00" * 10_000, "é\ud83d" * 300])
EXCEPTION_TYPES = st.sampled_from([
    ValueError, KeyError, TypeError, RuntimeError, AttributeError, LookupError,
    ZeroDivisionError, OSError, ConnectionError, TimeoutError, RecursionError, MemoryError,
    NotImplementedError, AssertionError, OverflowError, StopIteration, UnicodeError,
    PermanentError, NoSuchStatus, TransientError, InvalidEvent, UnsupportedVersion])


@st.composite
def exceptions(draw: st.DrawFn) -> Exception:
    """Any exception a user's code may raise, with any message, or none that can be shown."""
    message = draw(HOSTILE_MESSAGES)
    kind = draw(st.sampled_from(["plain", "unprintable", "named", "group"]))
    if kind == "unprintable":
        return Unprintable(message)
    if kind == "named":  # a class whose very name is hostile
        name = draw(st.sampled_from(["E" * 10_000, "Ünïcödé", "ok"]))
        permanent = draw(st.booleans())
        return type(name, (PermanentError if permanent else Exception,), {})(message)
    if kind == "group":
        return ExceptionGroup(message, [ValueError(message)])
    return draw(EXCEPTION_TYPES)(message)


def permanent(exc: Exception) -> bool:
    """The processor's rule, written out: ``PermanentError`` (the default classifier's one
    permanent type), and the errors a store raises for content it cannot hold, which no
    retry changes (the handler's own rule: ``documents.refuses_content``)."""
    return isinstance(exc, PermanentError | OverflowError | RecursionError | UnicodeEncodeError)


ROUTE_CODE = settings(max_examples=examples(80), deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture,
                                             HealthCheck.too_slow, HealthCheck.data_too_large])


@ROUTE_CODE
@given(exc=exceptions(), where=st.sampled_from(["upcaster", "position"]),
       ordered=st.booleans())
def test_whatever_route_code_raises_the_delivery_is_stored_and_answered(
        make_harness: Make, exc: Exception, where: str, ordered: bool) -> None:
    calls: list[Any] = []
    upcast = raising_on(1, exc) if where == "upcaster" else unreadable_position(exc)
    routes = ordered_router(upcast, calls) if ordered else Router()
    if not ordered:
        routes.handler("ORD", versions=("v2",), upcasters={"v1": upcast})(
            lambda context: calls.append(context.event.entity_data["ts"]))
    h = make_harness(router=routes, max_attempts=2)
    final = permanent(exc)
    for attempt in (1, 2):
        answer = h.push(order_event(1), f"m-{attempt}", idempotency_key="k")
        assert answer.status_code in (200, 503), answer.status_code
        stored = record_of(h.store, "p:p1:k")
        assert stored["event_status"] == "FAILED", stored["event_status"]
        error = stored["error"]
        # What is stored of the error is storable text, bounded, on any store.
        for text in (error["type"], error["message"]):
            assert isinstance(text, str) and len(text) <= 4096
            text.encode("utf-8")  # raises for a lone surrogate
            assert "\x00" not in text
        if final or attempt == 2:  # permanent, or the attempt cap: FAILED for good, acked
            assert answer.status_code == 200 and answer.json["outcome"] == "rejected"
            assert stored["retryable"] is False
            break
        assert answer.status_code == 503 and answer.json["outcome"] == "retry"
        assert stored["retryable"] is True and stored["redrive_at"] is not None
        h.clock.advance(10)
    assert calls == []
