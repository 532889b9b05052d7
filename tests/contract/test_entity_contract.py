"""Entity records of ordered handlers on both stores: hold, release with the finish, orphans.

``take_entities`` holds a free entity for one owner (concurrent takes: one
wins), a held one stays with its holder until released or until its lease
runs out (then the old holder's keys are the ``orphan``); ``finish_many``
releases entities in the same call as the events' outcomes and stores the
applied position; an unclaimed event is PENDING again with its attempt back.
Entity records never show in the operator queries of events.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.order import entity_key
from eventbus.store.base import EntityRelease, EntityTake, EventStore, Finish, Finished
from eventbus.store.operator_queries import EventQuery
from tests.contract.conftest import FIELDS, StoreClock, near, new_key

ENTITY = {"partnerId": "p-1", "entity_type": "Order", "entity_id": "order-1"}


def take(keys: tuple[str, ...] = ("k1",), positions: tuple[int, ...] = (1,)) -> EntityTake:
    return EntityTake(ENTITY, keys, positions)


def fresh_entity() -> str:
    return entity_key("p-1", "Order", new_key())


def test_a_free_entity_is_held_and_a_held_one_is_not_taken_again(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: take()}, now)
    assert first.held(key) and first.records[key]["entity"] == ENTITY
    assert first.records[key].get("position") is None  # nothing applied yet
    assert near(store_clock, first.records[key]["holder"]["until"], now + store.lease)
    store_clock.advance(1)
    second = store.take_entities({key: take(("k2",), (2,))}, now + timedelta(seconds=1))
    assert not second.held(key)
    assert second.records[key]["holder"]["owner"] == first.owner


def test_concurrent_takes_of_one_entity_hold_it_once(store: EventStore, now: datetime) -> None:
    key, results, gate = fresh_entity(), [], threading.Barrier(4)

    def racer(n: int) -> None:
        gate.wait()
        results.append(store.take_entities({key: take((f"k{n}",), (n,))}, now).held(key))

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [False, False, False, True]


def test_the_release_rides_with_the_finish_and_stores_the_position(store: EventStore,
                                                                    now: datetime) -> None:
    key, event = fresh_entity(), new_key()
    claim = store.claim(event, FIELDS, now)
    holds = store.take_entities({key: take((event,), (7,))}, now)
    done = store.finish_many([Finish(event, claim.owner, extra={"order": {"position": 7}})],
                             now, [EntityRelease(key, holds.owner, 7, event)])
    assert not done.lost
    record = store.get(key) or {}
    assert (record["position"], record["applied_key"]) == (7, event)
    assert "holder" not in record and (store.get(event) or {})["order"] == {"position": 7}
    again = store.take_entities({key: take(("k9",), (9,))}, now)
    assert again.held(key) and again.records[key]["position"] == 7


def test_a_release_without_an_applied_key_frees_the_entity_and_keeps_its_position(
        store: EventStore, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: take()}, now)
    store.finish_many([], now, [EntityRelease(key, first.owner, 3, "k1")])
    second = store.take_entities({key: take(("k2",), (2,))}, now)
    store.finish_many([], now, [EntityRelease(key, second.owner)])  # its event failed
    record = store.get(key) or {}
    assert record["position"] == 3 and record["applied_key"] == "k1" and "holder" not in record


def test_a_release_by_an_owner_who_lost_the_entity_changes_nothing(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # The first holder froze past its hold, another took the entity: its late
    # release changes nothing (fenced) and says so in ``unreleased``.
    key = fresh_entity()
    first = store.take_entities({key: take()}, now)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    later = now + store.lease + timedelta(seconds=1)
    second = store.take_entities({key: take(("k2",), (2,))}, later)
    assert second.held(key)
    before = store.get(key)
    done = store.finish_many([], later, [EntityRelease(key, first.owner, 1, "k1")])
    assert done == Finished(unreleased=frozenset({key}))
    record = store.get(key) or {}
    assert record == before
    assert record["holder"]["owner"] == second.owner and record.get("position") is None


def test_a_release_after_the_hold_lapsed_changes_nothing_even_if_nobody_took_it(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: take()}, now)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    before = store.get(key)
    done = store.finish_many([], now, [EntityRelease(key, first.owner, 1, "k1")])
    assert done.unreleased == frozenset({key}) and store.get(key) == before
    assert store.renew_entities({key: first.owner}, now) == set()  # nor renewed
    assert store.get(key) == before
    holds = store.take_entities({key: take(("k2",), (2,))}, now)  # its keys are orphans now
    assert holds.held(key) and holds.records[key]["orphan"]["keys"] == ["k1"]


def test_an_expired_holder_becomes_the_orphan_of_the_next_take(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: take(("a", "b"), (4, 5))}, now)  # then it crashed
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    later = now + store.lease + timedelta(seconds=1)
    holds = store.take_entities({key: take(("c",), (6,))}, later)
    assert holds.held(key)
    assert holds.records[key]["orphan"] == {"keys": ["a", "b"], "positions": [4, 5]}
    store.finish_many([], later, [EntityRelease(key, holds.owner, 6, "c")])
    assert "orphan" not in (store.get(key) or {})


def test_many_entities_are_held_at_once(store: EventStore, now: datetime) -> None:
    keys = [fresh_entity() for _ in range(5)]
    busy = keys[0]
    store.take_entities({busy: take()}, now)
    holds = store.take_entities({key: take() for key in keys}, now)
    assert [holds.held(key) for key in keys] == [False, True, True, True, True]
    store.finish_many([], now, [EntityRelease(key, holds.owner, 1, "k1") for key in keys[1:]])
    assert all((store.get(key) or {}).get("position") == 1 for key in keys[1:])


def test_an_unclaimed_event_is_pending_again_with_its_attempt_back(store: EventStore,
                                                                    now: datetime) -> None:
    event = new_key()
    first = store.claim(event, FIELDS, now)
    done = store.finish_many([Finish(event, first.owner, unclaim=True)], now)
    assert not done.lost
    record = store.get(event) or {}
    assert (record["event_status"], record["attempts"]) == ("PENDING", 0)
    assert store.claim(event, FIELDS, now).attempt == 1


def test_entity_records_never_show_as_events(store: EventStore, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: take()}, now)
    assert key not in {r["idempotency_key"] for r in store.summaries()}
    found = store.find_events(EventQuery(), limit=100)  # type: ignore[attr-defined]
    assert key not in {r["idempotency_key"] for r in found}
    counts = store.count_events(EventQuery(), ["event_status"])  # type: ignore[attr-defined]
    assert sum(count.count for count in counts) == 0


def test_renewing_a_hold_keeps_the_entity_past_its_first_lease(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key, lost = fresh_entity(), fresh_entity()
    holds = store.take_entities({key: take(), lost: take()}, now)
    quarter = store.lease.total_seconds() / 4
    store_clock.advance(3 * quarter)
    later = now + store.lease * 0.75
    assert store.renew_entities({key: holds.owner}, later) == {key}
    store_clock.advance(3 * quarter)  # 1.5 leases in
    thief = store.take_entities({lost: take(("t",), (2,))}, now + store.lease * 1.5)
    assert thief.held(lost)  # ``lost`` ran out unrenewed and was taken
    assert store.renew_entities({key: holds.owner, lost: holds.owner}, later) == {key}
    record = store.get(key) or {}
    assert near(store_clock, record["holder"]["until"], now + store.lease * 2.5)
    still = store.take_entities({key: take(("k2",), (2,))}, now + store.lease * 1.5)
    assert not still.held(key)  # renewed at 1.5 leases: held until 2.5 leases


def test_the_heartbeat_renews_the_entities_a_batch_holds(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    from eventbus.processor.heartbeat import Heartbeat

    key = fresh_entity()
    holds = store.take_entities({key: take()}, now)
    clock = [now + store.lease * 0.75]
    store_clock.advance(store.lease.total_seconds() * 0.75)
    beat = Heartbeat(store, now=lambda: clock[0], background=False)
    with beat.hold({}, {key: holds.owner}):
        beat.beat()
    store_clock.advance(store.lease.total_seconds() * 0.75)
    assert not store.take_entities({key: take(("k2",), (2,))},
                                   now + store.lease * 1.5).held(key)


# -- holds taken by the claim itself (``claim_many(..., takes=)``) ----------------------------


def test_a_claim_holds_the_entity_of_a_new_event_in_the_same_call(store: EventStore,
                                                                   now: datetime) -> None:
    # One key (a push: one command on MongoDB) and a batch (the claim's insert).
    for events in ([new_key()], [new_key(), new_key()]):
        keys = {event: fresh_entity() for event in events}
        batch = store.claim_many(dict.fromkeys(events, FIELDS), now,
                                 {keys[e]: take((e,), (5,)) for e in events})
        assert set(batch.taken) == set(events) and batch.holds is not None
        for event, key in keys.items():
            assert batch.holds.held(key) and batch.holds.owner_of(key) == batch.holds.owner
            record = store.get(key) or {}
            assert record["holder"]["owner"] == batch.holds.owner
            assert (record["holder"]["keys"], record["entity"]) == ([event], ENTITY)
            assert record.get("position") is None
        done = store.finish_many([Finish(e, batch.taken[e].owner) for e in events], now,
                                 [EntityRelease(k, batch.holds.owner, 5, e)
                                  for e, k in keys.items()])
        assert not done.lost
        assert all((store.get(k) or {}).get("position") == 5 for k in keys.values())


def test_a_claim_holds_a_free_entity_at_or_below_the_lowest_position(store: EventStore,
                                                                      now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: take()}, now)
    store.finish_many([], now, [EntityRelease(key, first.owner, 5, "k1")])
    for position in (5, 8):  # equal: another event at the same position runs
        event = new_key()
        batch = store.claim_many({event: FIELDS}, now, {key: take((event,), (position,))})
        assert batch.holds is not None and batch.holds.held(key)
        store.finish_many([Finish(event, batch.taken[event].owner)], now,
                          [EntityRelease(key, batch.holds.owner, position, event)])
    assert (store.get(key) or {})["position"] == 8


def test_a_claim_leaves_a_held_ahead_or_orphaned_entity_to_take_entities(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    held, ahead, orphaned = fresh_entity(), fresh_entity(), fresh_entity()
    holder = store.take_entities({held: take(), orphaned: take(("a",), (1,))}, now).owner
    first = store.take_entities({ahead: take()}, now)
    store.finish_many([], now, [EntityRelease(ahead, first.owner, 9, "k1")])
    half = store.lease.total_seconds() / 2
    store_clock.advance(half)
    assert store.renew_entities({held: holder}, now) == {held}
    store_clock.advance(half + 1)  # the holder of ``orphaned`` ran out, ``held`` still holds
    later = now + store.lease + timedelta(seconds=1)
    for key in (held, ahead, orphaned):
        for events in ([new_key()], [new_key(), new_key()]):
            before = store.get(key)
            batch = store.claim_many(dict.fromkeys(events, FIELDS), later if key == orphaned
                                     else now, {key: take(tuple(events), (2,) * len(events))})
            assert set(batch.taken) == set(events)  # the events are claimed all the same
            assert batch.holds is not None and not batch.holds.held(key)
            assert store.get(key) == before  # left as it was, for take_entities
    holds = store.take_entities({orphaned: take(("b",), (2,))}, later)
    assert holds.held(orphaned) and holds.records[orphaned]["orphan"]["keys"] == ["a"]


def test_a_claim_leaves_no_entity_held_for_events_it_did_not_take(store: EventStore,
                                                                   now: datetime) -> None:
    done = new_key()
    store.succeed(done, store.claim(done, FIELDS, now).owner, now)
    for events in ([done], [done, new_key()]):
        key = fresh_entity()
        batch = store.claim_many(dict.fromkeys(events, FIELDS), now,
                                 {key: take((done,), (3,))})
        assert done not in batch.taken and batch.holds is not None
        assert not batch.holds.held(key)
        assert "holder" not in (store.get(key) or {})  # free for the next event


def test_an_event_claimed_with_its_entity_is_stored_as_a_single_claim_stores_it(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    alone, held = new_key(), new_key()
    store.claim(alone, FIELDS, now)
    store.claim_many({held: FIELDS}, now, {fresh_entity(): take((held,), (1,))})
    skip = {"_id", "idempotency_key", "lease_owner", "lease_until"}  # the lease: near
    single = {k: v for k, v in (store.get(alone) or {}).items() if k not in skip}
    claimed = {k: v for k, v in (store.get(held) or {}).items() if k not in skip}
    assert claimed == single and single["attempts"] == 1
    for key in (alone, held):
        assert near(store_clock, (store.get(key) or {})["lease_until"], now + store.lease)


# -- fenced holds: orphans accumulate, releases keep orphans, positions only move forward ------


def test_orphans_accumulate_over_two_lapsed_holders(store: EventStore, store_clock: StoreClock,
                                                    now: datetime) -> None:
    # Two holders crash one after the other: the second take adds the first
    # one's keys to the orphan instead of replacing them, so nothing is lost.
    key = fresh_entity()
    lapse = (store.lease + timedelta(seconds=1)).total_seconds()
    store.take_entities({key: take(("a", "b"), (4, 5))}, now)  # crashed
    store_clock.advance(lapse)
    second = store.take_entities({key: take(("c",), (6,))}, now)  # crashed too
    assert second.held(key)
    assert second.records[key]["orphan"] == {"keys": ["a", "b"], "positions": [4, 5]}
    store_clock.advance(lapse)
    third = store.take_entities({key: take(("d",), (7,))}, now)
    assert third.held(key)
    assert third.records[key]["orphan"] == {"keys": ["a", "b", "c"], "positions": [4, 5, 6]}
    assert (store.get(key) or {})["orphan"] == third.records[key]["orphan"]


def test_a_release_keeps_the_orphans_it_did_not_settle_and_a_claim_then_holds_nothing(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: take(("a", "b"), (4, 5))}, now)  # crashed
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    holds = store.take_entities({key: take(("c",), (6,))}, now)
    left: dict[str, list[Any]] = {"keys": ["b"], "positions": [5]}  # ``b`` not finished yet
    done = store.finish_many([], now, [EntityRelease(key, holds.owner, 6, "c", orphan=left)])
    assert done == Finished()
    record = store.get(key) or {}
    assert "holder" not in record and record["orphan"] == left and record["position"] == 6
    # A claim's cheap hold never holds an entity with orphans: take_entities reads them.
    event = new_key()
    batch = store.claim_many({event: FIELDS}, now, {key: take((event,), (7,))})
    assert batch.holds is not None and not batch.holds.held(key)
    assert store.get(key) == record
    again = store.take_entities({key: take((event,), (7,))}, now)
    assert again.held(key) and again.records[key]["orphan"] == left
    store.finish_many([], now, [EntityRelease(key, again.owner, 7, event)])  # all settled
    assert "orphan" not in (store.get(key) or {})


def test_the_position_never_moves_backwards_through_a_release(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: take(("k7",), (7,))}, now)
    assert store.finish_many([], now, [EntityRelease(key, first.owner, 7, "k7")]) == Finished()
    second = store.take_entities({key: take(("k5",), (5,))}, now)  # an older event, after
    assert store.finish_many([], now, [EntityRelease(key, second.owner, 5, "k5")]) == Finished()
    record = store.get(key) or {}
    assert (record["position"], record["applied_key"]) == (7, "k7") and "holder" not in record
    third = store.take_entities({key: take(("k9",), (9,))}, now)
    assert store.finish_many([], now, [EntityRelease(key, third.owner, 9, "k9")]) == Finished()
    assert ((store.get(key) or {})["position"], (store.get(key) or {})["applied_key"]) == (9, "k9")
