"""Per-entity order (``ordered_by``) on the in-memory store: newest wins, one at a time.

The sync guide's A, B, C: A retried after B and C must not overwrite C. A
handler declared with ``ordered_by`` never runs for an event older than one
applied for its entity (stored SUCCESS as stale, acked), never beside
another event of that entity, and moves the entity's position with its
SUCCESS; an event without a usable position is stored FAILED for good.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.order import entity_key
from eventbus.model.router import Router
from eventbus.processor import Processor, Result
from eventbus.settings import Settings
from eventbus.store.base import EntityRelease, EntityTake, Finish
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.workers.pull import Inbox, PullWorker
from tests.closing import closed_after_test, closed_here
from tests.hypothesis_profiles import examples

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
ENTITY = {"partnerId": "p1", "entity_id": "order-7", "entity_type": "Order"}
ENTITY_KEY = entity_key("p1", "Order", "order-7")


@dataclasses.dataclass
class Bus:
    store: MemoryEventStore
    processor: Processor
    clock: FakeClock
    seen: list[Any]
    slept: list[float]
    failing: set[Any]

    def deliver(self, position: Any, key: str, **data: Any) -> Result:
        return self.processor.process(delivery(position, key, **data))

    def status(self, key: str) -> str:
        return str((self.store.get(f"p:p1:{key}") or {}).get("event_status"))


def delivery(position: Any, key: str, entity: dict[str, str] = ENTITY, **data: Any) -> Delivery:
    body = {"event_type": "OR_MGMT", "event_version": "v1", "entity_metadata": entity,
            "entity_data": {"ts": position, **data}}
    return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=f"m-{key}")


def bus(concurrency: int = 1) -> Bus:
    seen: list[Any] = []
    slept: list[float] = []
    failing: set[Any] = set()
    routes = Router()

    @routes.handler("OR_MGMT", ordered_by="entity_data.ts")
    def project(context: Context) -> None:
        if context.event.entity_data["ts"] in failing:
            raise ConnectionError("partner down")
        seen.append(context.event.entity_data["ts"])

    clock = FakeClock(NOW)
    store = MemoryEventStore(lease=dt.timedelta(seconds=20), clock=clock)
    # max_attempts above the hypothesis test's deliveries of one failing event (at most 8).
    processor = closed_after_test(Processor(
        store, routes, Settings(max_attempts=10, order_wait_seconds=0.2), clock,
        concurrency=concurrency, sleep=slept.append))
    return Bus(store, processor, clock, seen, slept, failing)


def test_a_late_older_event_never_overwrites_newer_state() -> None:
    b = bus()
    outcomes = [b.deliver(3, "c").outcome.value, b.deliver(1, "a").outcome.value,
                b.deliver(2, "b").outcome.value]
    assert outcomes == ["processed", "stale", "stale"]
    assert b.seen == [3]
    stale = b.store.get("p:p1:a") or {}
    assert stale["event_status"] == "SUCCESS" and "outbox" not in stale
    assert stale["stale"]["applied_position"] == 3 and stale["stale"]["position"] == 1
    entity = b.store.get(ENTITY_KEY) or {}
    assert (entity["position"], entity["applied_key"]) == (3, "p:p1:c")


def test_newer_events_run_in_turn_and_duplicates_stay_duplicates() -> None:
    b = bus()
    assert [b.deliver(n, f"k{n}").outcome.value for n in (1, 2, 3)] == ["processed"] * 3
    assert b.deliver(2, "k2").outcome.value == "duplicate"
    assert b.seen == [1, 2, 3]


def test_equal_positions_are_told_apart_by_the_key() -> None:
    b = bus()
    assert b.deliver(5, "x").outcome.value == "processed"
    assert b.deliver(5, "y").outcome.value == "processed"  # another event at the same position
    assert b.deliver(5, "x").outcome.value == "duplicate"  # the same event again
    assert b.seen == [5, 5]


def test_times_compare_as_times_whatever_their_offset() -> None:
    b = bus()
    assert b.deliver("2026-11-25T12:00:00Z", "late").outcome.value == "processed"
    assert b.deliver("2026-11-25T12:30:00+01:00", "early").outcome.value == "stale"  # 11:30Z
    assert b.deliver("2026-11-25T12:00:00.000001Z", "after").outcome.value == "processed"


@pytest.mark.parametrize("position", [None, "soon", True, [1], {"t": 1}, float("nan"), 2**70,
                                      "2026-13-45T99:00:00Z", "\ud800", "a\x00b"])
def test_an_event_without_a_usable_position_is_stored_failed_for_good(position: Any) -> None:
    b = bus()
    body = {"event_type": "OR_MGMT", "event_version": "v1", "entity_metadata": ENTITY,
            "entity_data": {"ts": position}}
    data = json.dumps(body).encode("utf-8", "surrogatepass")
    result = b.processor.process(Delivery(data, {"idempotency_key": "bad"}, message_id="m"))
    assert result.outcome.value == "rejected" and b.seen == []
    record = b.store.get(result.key) or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is False
    assert "ordered_by" in record["error"]["message"] or "ts" in record["error"]["message"] \
        or record["error"]["classification"] in ("invalid", "content")


def test_a_busy_entity_gives_the_claim_back_and_the_event_comes_back() -> None:
    b = bus()
    other = b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("other",), (9,))}, NOW)
    result = b.deliver(4, "d")
    assert result.outcome.value == "in_progress" and b.seen == []
    assert b.slept and sum(b.slept) == pytest.approx(0.2)  # order_wait_seconds, never slept
    record = b.store.get("p:p1:d") or {}
    assert (record["event_status"], record["attempts"]) == ("PENDING", 0)  # nothing spent
    b.store.finish_many([], NOW, [_release(other.owner)])
    assert b.deliver(4, "d").outcome.value == "processed" and b.seen == [4]
    assert (b.store.get("p:p1:d") or {})["attempts"] == 1


def test_a_crash_between_success_and_release_never_lets_an_older_event_through() -> None:
    b = bus()
    assert b.deliver(1, "first").outcome.value == "processed"
    # A worker claims and holds "newer" at 5, stores its SUCCESS, and dies before the release.
    fields = b.processor.locate(delivery(5, "newer")).fields
    claim = b.store.claim("p:p1:newer", fields, NOW)
    b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("p:p1:newer",), (5,))}, NOW)
    b.store.finish_many([Finish("p:p1:newer", claim.owner)], NOW)
    b.clock.advance(60)  # its hold runs out
    assert b.deliver(3, "older").outcome.value == "stale"
    assert (b.store.get(ENTITY_KEY) or {})["position"] == 5  # rolled forward
    assert b.deliver(6, "newest").outcome.value == "processed"


def test_a_transient_failure_keeps_the_position_and_retries() -> None:
    b = bus()
    b.failing.add(2)
    assert b.deliver(2, "two").outcome.value == "retry"
    assert (b.store.get(ENTITY_KEY) or {}).get("position") is None
    assert b.deliver(1, "one").outcome.value == "processed"
    b.failing.clear()
    assert b.deliver(2, "two").outcome.value == "processed"  # its retry, now it works
    assert b.seen == [1, 2]


def test_other_entities_are_independent() -> None:
    b = bus()
    other = {**ENTITY, "entity_id": "order-8"}
    assert b.deliver(5, "a").outcome.value == "processed"
    result = b.processor.process(delivery(1, "b", entity=other))
    assert result.outcome.value == "processed" and b.seen == [5, 1]


def test_a_batch_runs_each_entitys_events_in_position_order() -> None:
    b = bus(concurrency=4)
    other = {**ENTITY, "entity_id": "order-8"}
    batch = [delivery(3, "c"), delivery(1, "a"), delivery(10, "x", entity=other),
             delivery(2, "b")]
    results = b.processor.run(batch)
    assert [r.outcome.value for r in results] == ["processed"] * 4
    assert [n for n in b.seen if n != 10] == [1, 2, 3]
    assert (b.store.get(ENTITY_KEY) or {})["position"] == 3


def test_a_lane_behind_a_long_handler_of_its_batch_confirms_its_hold_first() -> None:
    # The batch's lanes run one after the other: the entity's hold, taken with the claim,
    # lapses while the other lane's handler runs past the lease, and another worker applies
    # a newer position meanwhile. The lane's first event must not run on the lapsed hold.
    seen: list[Any] = []
    routes = Router()
    clock = FakeClock(NOW)
    store = MemoryEventStore(lease=dt.timedelta(seconds=20), clock=clock)

    @routes.handler("OR_MGMT", ordered_by="entity_data.ts")
    def project(context: Context) -> None:
        seen.append(context.event.entity_data["ts"])

    @routes.handler("SLOW")
    def slow(context: Context) -> None:
        clock.advance(60)  # a pause past the lease: no heartbeat meanwhile
        other = store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("p:p1:newer",), (5,))},
                                    clock())
        store.finish_many([], clock(), [EntityRelease(ENTITY_KEY, other.owner, 5,
                                                      "p:p1:newer")])

    processor = closed_after_test(Processor(store, routes, Settings(), clock, sleep=clock.sleep,
                                            monotonic=clock.monotonic))
    body = {"event_type": "SLOW", "event_version": "v1", "entity_metadata": ENTITY,
            "entity_data": {}}
    first = Delivery(json.dumps(body).encode(), {"idempotency_key": "slow"}, message_id="m-s")
    results = processor.run([first, delivery(3, "older")])
    assert seen == []  # position 3 never ran after 5 was applied
    assert results[1].outcome.value in ("in_progress", "lease_lost")  # 503: it comes back
    assert (store.get(ENTITY_KEY) or {})["position"] == 5


@dataclasses.dataclass
class Pulled:
    """A pulled message with an ordering key, recording its answer."""

    data: bytes
    attributes: dict[str, str]
    message_id: str
    ordering_key: str
    delivery_attempt: int | None = 1
    answer: str = ""

    def ack(self) -> None:
        self.answer = "ack"

    def nack(self) -> None:
        self.answer = "nack"

    def ack_with_response(self) -> Any:
        raise AssertionError("not exactly-once")


def pulled(position: int, key: str, ordering_key: str) -> Pulled:
    message = delivery(position, key)
    return Pulled(message.data, dict(message.attributes), f"m-{key}", ordering_key)


def test_a_failure_in_an_ordering_key_nacks_the_rest_of_that_key_in_the_batch() -> None:
    b = bus()
    b.failing.add(2)
    worker = PullWorker(b.processor, Inbox(), subscription="s")
    other = Pulled(delivery(7, "z", entity={**ENTITY, "entity_id": "order-9"}).data,
                   {"idempotency_key": "z"}, "m-z", "order-9")
    batch = [pulled(1, "a", "order-7"), pulled(2, "b", "order-7"), other,
             pulled(3, "c", "order-7")]
    worker.run_batch(batch)
    assert [m.answer for m in batch] == ["ack", "nack", "ack", "nack"]
    b.failing.clear()
    again = [pulled(2, "b", "order-7"), pulled(3, "c", "order-7")]  # redelivered in order
    results = worker.run_batch(again)
    assert [m.answer for m in again] == ["ack", "ack"]
    # 3 ran in the first batch (stored SUCCESS, nacked only to keep the key's order), so
    # the retried 2 is older than what is applied: stale, never run backwards.
    assert [r.outcome.value for r in results] == ["stale", "duplicate"]
    assert sorted(b.seen) == [1, 3, 7] and (b.store.get(ENTITY_KEY) or {})["position"] == 3


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(order=[0, 1, 2, 3, 4, 5], repeats=[5, 5, 5, 5], failing={0, 5})
@given(order=st.permutations(list(range(6))), repeats=st.lists(st.integers(0, 5), max_size=6),
       failing=st.sets(st.integers(0, 5), max_size=2))
def test_whatever_the_order_the_newest_wins_and_nothing_runs_backwards(
        order: list[int], repeats: list[int], failing: set[int]) -> None:
    b = bus()
    b.failing.update(failing)
    with closed_here(b.processor):  # each example's threads end with it
        for position in [*order, *repeats]:
            b.deliver(position, f"k{position}")
        b.failing.clear()
        for position in sorted(failing):  # the retries, later
            b.deliver(position, f"k{position}")
    assert b.seen == sorted(b.seen) and len(set(b.seen)) == len(b.seen)  # forward only, once
    applied = (b.store.get(ENTITY_KEY) or {})["position"]
    assert applied == 5 and b.seen[-1] == 5  # the newest, whenever it came
    assert {b.status(f"k{n}") for n in range(6)} == {"SUCCESS"}  # each stored, applied or stale


def _release(owner: str) -> Any:
    from eventbus.store.base import EntityRelease

    return EntityRelease(ENTITY_KEY, owner)


def test_the_demos_progress_counts_a_stale_event_as_finished() -> None:
    # ``make run``'s demo waits until every event is finished; a stale one is.
    import io

    from eventbus.ops import progress

    b = bus()
    b.deliver(2, "new")
    stale = b.deliver(1, "old")
    assert stale.outcome.value == "stale"
    statuses = progress.cascade_statuses(b.store, {stale.key})
    assert statuses == {stale.key: "SUCCESS(stale)"}
    assert progress.watch(b.store, [stale.key], timeout=0, out=io.StringIO()) is True
