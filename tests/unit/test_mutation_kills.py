"""The ordered lane and the entity documents: the cases mutation testing found untested.

``infra/mutation.sh`` (issue 39, ``docs/mutation.md``) changed ``eventbus.processor.ordering``
and the entity and claim documents one token at a time; these tests state the behaviour a
surviving change broke, on the memory store (the stores agree: ``tests/contract``). A crashed
holder's orphan rolls the entity forward only by a SUCCESS that is not stale and of a
comparable kind, and keeps the keys still PROCESSING; a stale or mismatched event's record
and result say why; a busy entity is polled within ``order_wait_seconds`` and its event given
back due for the redrive; the claim's holds save the take's round trip.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.order import entity_key
from eventbus.model.router import Router
from eventbus.processor import Processor, Result
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EntityHolds, EntityRelease, EntityTake, Finish
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from tests.closing import closed_after_test
from tests.logged import logged

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
ENTITY = {"partnerId": "p1", "entity_id": "order-7", "entity_type": "Order"}
ENTITY_KEY = entity_key("p1", "Order", "order-7")
OTHER = {**ENTITY, "entity_id": "order-8"}
OTHER_KEY = entity_key("p1", "Order", "order-8")


class Counting(MemoryEventStore):
    """The memory store, counting the round trips that take entities."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.takes: list[list[str]] = []

    def take_entities(self, takes: Mapping[str, EntityTake], now: dt.datetime) -> EntityHolds:
        self.takes.append(list(takes))
        return super().take_entities(takes, now)


@dataclasses.dataclass
class Bus:
    store: Counting
    processor: Processor
    clock: FakeClock
    seen: list[Any]
    slept: list[Any]
    failing: set[Any]
    on_sleep: list[Any]

    def deliver(self, position: Any, key: str, entity: dict[str, str] = ENTITY) -> Result:
        return self.processor.process(delivery(position, key, entity))

    def record(self, key: str) -> dict[str, Any]:
        return self.store.get(f"p:p1:{key}") or {}

    def entity(self, key: str = ENTITY_KEY) -> dict[str, Any]:
        return self.store.get(key) or {}

    def crashed_holder(self, *events: tuple[str, Any, str]) -> None:
        """A worker claims ``events`` (key, position, end), holds the entity, stores each
        event's end ("success", "stale", "failed" or "none": still PROCESSING), and dies
        before its release; its hold then runs out."""
        keys, positions = [], []
        for key, position, end in events:
            full = f"p:p1:{key}"
            claim = self.store.claim(full, self.processor.locate(
                delivery(position, key)).fields, NOW)
            keys.append(full)
            positions.append(position)
            order = {"entity_key": ENTITY_KEY, "position": position, "kind": "number"}
            if end == "success":
                self.store.finish_many([Finish(full, claim.owner, extra={"order": order})], NOW)
            elif end == "stale":
                self.store.finish_many([Finish(full, claim.owner, extra={
                    "order": order, "stale": {"position": position}})], NOW)
            elif end == "failed":
                self.store.fail(full, claim.owner, NOW, {"type": "X", "message": "x",
                                                        "classification": "transient"},
                                retryable=True)
        self.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, tuple(keys),
                                                         tuple(positions))}, NOW)
        self.clock.advance(60)  # the hold (and the claims' leases) ran out


def delivery(position: Any, key: str, entity: dict[str, str] = ENTITY) -> Delivery:
    body = {"event_type": "OR_MGMT", "event_version": "v1", "entity_metadata": entity,
            "entity_data": {"ts": position}}
    return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=f"m-{key}")


def plain(key: str) -> Delivery:
    body = {"event_type": "NOTE", "event_version": "v1", "entity_metadata": ENTITY,
            "entity_data": {"text": key}}
    return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=f"m-{key}")


def bus() -> Bus:
    seen: list[Any] = []
    slept: list[Any] = []
    failing: set[Any] = set()
    on_sleep: list[Any] = []
    routes = Router()

    @routes.handler("OR_MGMT", ordered_by="entity_data.ts")
    def project(context: Context) -> None:
        if context.event.entity_data["ts"] in failing:
            raise ConnectionError("partner down")
        seen.append(context.event.entity_data["ts"])

    @routes.handler("NOTE")
    def note(context: Context) -> None:
        seen.append(context.event.entity_data["text"])

    def sleep(seconds: Any) -> None:
        slept.append(seconds)
        if on_sleep:
            on_sleep.pop(0)()

    clock = FakeClock(NOW)
    store = Counting(lease=dt.timedelta(seconds=20), clock=clock)
    processor = closed_after_test(Processor(
        store, routes, Settings(max_attempts=10, order_wait_seconds=0.2), clock, sleep=sleep))
    return Bus(store, processor, clock, seen, slept, failing, on_sleep)


# -- stale and mismatched events ---------------------------------------------------------------


def test_an_event_at_the_applied_position_runs_and_a_stale_one_says_what_won() -> None:
    b = bus()
    assert b.deliver(3, "c").outcome.value == "processed"
    assert b.deliver(3, "d").outcome.value == "processed"  # equal: not older, not applied
    result = b.deliver(1, "a")
    assert (result.outcome.value, result.key, result.event_type, result.attempt) == (
        "stale", "p:p1:a", "OR_MGMT", 1)
    assert b.record("a")["stale"] == {"position": 1, "applied_position": 3,
                                      "applied_key": "p:p1:c", "entity_key": ENTITY_KEY}


def test_a_stale_event_names_the_key_applied_before_this_lane() -> None:
    b = bus()
    assert b.deliver(5, "e").outcome.value == "processed"
    assert b.deliver(2, "b").outcome.value == "stale"
    assert b.record("b")["stale"]["applied_key"] == "p:p1:e"


def test_a_mismatched_kind_is_a_permanent_failure_that_says_why() -> None:
    b = bus()
    assert b.deliver(5, "n").outcome.value == "processed"
    with logged("eventbus") as records:
        result = b.deliver("2026-11-25T12:00:00Z", "t")
    assert (result.outcome.value, result.key, result.event_type, result.attempt) == (
        "rejected", "p:p1:t", "OR_MGMT", 1)
    assert result.error.startswith("PositionKindMismatch")
    record = b.record("t")
    assert (record["event_status"], record["retryable"]) == ("FAILED", False)
    assert record["error"]["classification"] == "permanent"
    assert record["error"]["type"] == "PositionKindMismatch"
    assert any(r.levelno == logging.ERROR and "position kind mismatch on p:p1:t" in r.getMessage()
               for r in records)


# -- a crashed holder's orphan -------------------------------------------------------------------


@pytest.mark.parametrize("applied_first", [True, False], ids=["applied-1", "new-entity"])
def test_a_crashed_holders_success_rolls_the_entity_forward(applied_first: bool) -> None:
    b = bus()
    if applied_first:
        assert b.deliver(1, "first").outcome.value == "processed"
    b.crashed_holder(("newer", 5, "success"))
    assert b.deliver(3, "older").outcome.value == "stale"
    entity = b.entity()
    assert (entity["position"], entity["applied_key"]) == (5, "p:p1:newer")
    assert b.deliver(6, "newest").outcome.value == "processed"


@pytest.mark.parametrize("end", ["stale", "failed"])
@pytest.mark.parametrize("applied_first", [True, False], ids=["applied-1", "new-entity"])
def test_a_crashed_holders_stale_or_failed_event_moves_nothing(end: str,
                                                              applied_first: bool) -> None:
    b = bus()
    if applied_first:
        assert b.deliver(1, "first").outcome.value == "processed"
    b.crashed_holder(("newer", 5, end))
    assert b.deliver(3, "mid").outcome.value == "processed"
    assert (b.entity()["position"], b.entity().get("orphan")) == (3, None)


def test_a_crashed_holders_unfinished_event_stays_in_the_orphan() -> None:
    b = bus()
    assert b.deliver(1, "first").outcome.value == "processed"
    b.crashed_holder(("paused", 5, "none"), ("done", 2, "success"))
    assert b.deliver(3, "mid").outcome.value == "processed"
    entity = b.entity()
    assert entity["position"] == 3
    assert entity["orphan"] == {"keys": ["p:p1:paused"], "positions": [5]}


def test_an_orphan_key_redelivered_in_the_lane_is_not_kept_as_unsettled() -> None:
    b = bus()
    b.crashed_holder(("again", 4, "none"))
    b.clock.advance(60)
    assert b.deliver(4, "again").outcome.value == "processed"
    assert b.entity().get("orphan") is None


def test_a_success_of_another_kind_never_rolls_a_number_forward() -> None:
    b = bus()
    assert b.deliver(1, "first").outcome.value == "processed"
    full = "p:p1:t"
    located = b.processor.locate(delivery("2026-11-25T12:00:00Z", "t"))
    claim = b.store.claim(full, located.fields, NOW)
    assert located.order is not None
    order = {"entity_key": ENTITY_KEY, "position": located.order.position, "kind": "time"}
    b.store.finish_many([Finish(full, claim.owner, extra={"order": order})], NOW)
    b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, (full,), (5,))}, NOW)
    b.clock.advance(60)
    assert b.deliver(2, "n2").outcome.value == "processed"
    assert (b.entity()["position"], b.entity()["position_kind"]) == (2, "number")


def test_a_failed_first_event_applies_nothing_to_a_new_entity() -> None:
    b = bus()
    b.failing.add(2)
    assert b.deliver(2, "two").outcome.value == "retry"
    entity = b.entity()
    assert "applied_key" not in entity and entity.get("position") is None


# -- busy entities and the claim's holds ---------------------------------------------------------


def test_a_busy_entity_is_polled_and_its_event_runs_once_it_is_free() -> None:
    b = bus()
    other = b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("x",), (9,))}, NOW)
    b.on_sleep += [lambda: None, lambda: b.store.finish_many(
        [], NOW, [EntityRelease(ENTITY_KEY, other.owner)])]
    result = b.deliver(4, "d")
    assert result.outcome.value == "processed" and b.seen == [4]
    assert b.slept == [0.05, 0.05]
    assert b.store.takes[-2:] == [[ENTITY_KEY], [ENTITY_KEY]]


def test_a_busy_entitys_event_is_given_back_due_for_the_redrive() -> None:
    b = bus()
    b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("x",), (9,))}, NOW)
    assert b.deliver(4, "d").outcome.value == "in_progress"
    assert b.slept == [0.05] * 4
    record = b.record("d")
    assert record["event_status"] == "PENDING"
    assert record["redrive_at"] == documents.bson_time(NOW + dt.timedelta(seconds=1200))


def test_the_claim_holds_a_new_entity_without_a_take_round_trip() -> None:
    b = bus()
    assert b.deliver(1, "a").outcome.value == "processed"
    assert b.deliver(2, "b").outcome.value == "processed"
    assert b.store.takes == []


def test_a_batch_takes_only_the_entities_its_claim_did_not_hold() -> None:
    b = bus()
    assert b.deliver(9, "ahead", OTHER).outcome.value == "processed"  # OTHER is ahead
    b.store.takes.clear()
    results = b.processor.run([delivery(1, "new"), delivery(2, "behind", OTHER), plain("n1")])
    assert [r.outcome.value for r in results] == ["processed", "stale", "processed"]
    assert b.store.takes == [[OTHER_KEY]]
    assert sorted(map(str, b.seen)) == ["1", "9", "n1"]


def test_an_unordered_event_beside_ordered_ones_runs_in_its_own_lane() -> None:
    b = bus()
    results = b.processor.run([plain("n1"), delivery(1, "a"), plain("n2")])
    assert [r.outcome.value for r in results] == ["processed"] * 3
    assert sorted(map(str, b.seen)) == ["1", "n1", "n2"]


# -- the documents' Python forms -----------------------------------------------------------------


def test_released_without_an_applied_key_only_frees_and_stamps() -> None:
    record: dict[str, Any] = {"position": 4, "applied_key": "k", "position_kind": "number",
                              "holder": {"owner": "o"}}
    documents.released(record, NOW, 9)
    assert record == {"position": 4, "applied_key": "k", "position_kind": "number",
                      "lastUpdatedTime": documents.epoch_ms(NOW)}


def test_released_without_a_kind_moves_any_position_and_tags_nothing() -> None:
    record: dict[str, Any] = {"position": 4, "applied_key": "k", "position_kind": "number"}
    documents.released(record, NOW, 9, "k9")
    assert (record["position"], record["applied_key"], record["position_kind"]) == (
        9, "k9", "number")
    assert record["applied_at"] == documents.bson_time(NOW)


def test_holdable_without_a_kind_holds_only_an_untagged_position() -> None:
    assert documents.holdable({"position": 1}, 5)
    assert not documents.holdable({"position": 1, "position_kind": "number"}, 5)
    assert documents.holdable({"position": 1, "position_kind": "number"}, 5, "number")


def test_claimable_without_a_fingerprint_never_takes_a_refused_record() -> None:
    refused = {"event_status": "FAILED", documents.REJECTED: True, "retryable": False,
               "payload_fingerprint": "a"}
    assert not documents.claimable(refused, NOW)
    assert documents.claimable(refused, NOW, "b")
    held = {"event_status": "PENDING", "payload_fingerprint": "a"}
    assert not documents.claimable(held, NOW, "b")  # another payload: a conflict
    assert documents.claimable(held, NOW, "a") and documents.claimable(held, NOW)


def test_a_busy_entitys_result_says_so_and_spends_no_attempt() -> None:
    b = bus()
    b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("x",), (9,))}, NOW)
    result = b.deliver(4, "d")
    assert (result.outcome.value, result.key, result.event_type, result.attempt,
            result.error) == ("in_progress", "p:p1:d", "OR_MGMT", 0, "EntityBusy")
    assert b.record("d")["attempts"] == 0


def test_a_success_stores_its_order_for_a_later_roll_forward() -> None:
    b = bus()
    assert b.deliver(3, "c").outcome.value == "processed"
    assert b.record("c")["order"] == {"entity_key": ENTITY_KEY, "position": 3, "kind": "number"}


def test_a_batch_of_mixed_kinds_never_runs_an_event_of_another_kind_than_the_applied_one() -> None:
    # A take of mixed kinds may hold in the claim only an entity with no position or an
    # untagged one: the lane must see the tagged position, or the time event would run.
    b = bus()
    assert b.deliver(1, "n1").outcome.value == "processed"
    results = b.processor.run([delivery(2, "n2"), delivery("2026-11-25T12:00:00Z", "t")])
    assert [r.outcome.value for r in results] == ["processed", "rejected"]
    assert b.seen == [1, 2]


def test_an_event_at_the_applied_position_runs_when_the_lane_reads_the_position() -> None:
    # A batch with an older event cannot be held by the claim: its lane is taken the full
    # way and compares with the applied position, where an equal one is not older.
    b = bus()
    assert b.deliver(3, "c").outcome.value == "processed"
    results = b.processor.run([delivery(3, "d"), delivery(2, "e")])
    assert [r.outcome.value for r in results] == ["processed", "stale"]
    assert b.seen == [3, 3]


def test_an_orphan_success_at_the_applied_position_changes_nothing() -> None:
    b = bus()
    assert b.deliver(5, "a").outcome.value == "processed"
    b.crashed_holder(("b", 5, "success"))
    assert b.deliver(3, "older").outcome.value == "stale"
    assert b.record("older")["stale"]["applied_key"] == "p:p1:a"
    assert b.entity()["applied_key"] == "p:p1:a"


def test_a_roll_forward_alone_tags_a_new_entity_with_the_successs_kind() -> None:
    b = bus()
    b.crashed_holder(("newer", 5, "success"))
    assert b.deliver(3, "older").outcome.value == "stale"
    entity = b.entity()
    assert (entity["position"], entity["position_kind"]) == (5, "number")


def test_a_busy_entity_on_a_later_attempt_answers_the_attempt_already_spent() -> None:
    b = bus()
    b.failing.add(4)
    assert b.deliver(4, "d").outcome.value == "retry"  # attempt 1 spent
    b.store.take_entities({ENTITY_KEY: EntityTake(ENTITY, ("x",), (9,))}, NOW)
    result = b.deliver(4, "d")
    assert (result.outcome.value, result.attempt) == ("in_progress", 1)
    assert b.record("d")["attempts"] == 1
