"""One clock: every time comparison is the store's, whatever the caller's clock says.

Each test runs one time comparison (claim lease, renew, finish fence,
entity take / hold / renew / release, guard take / renew, redrivable,
mark_redriven, abandon) on both stores with the caller's ``now`` 10 minutes
behind, on time, or 10 minutes ahead, and expects the same outcome every
time: the caller's ``now`` only stamps audit fields. Time passes only on the
store's clock (``store_clock``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from eventbus.model.errors import AlreadyExists, LeaseHeld
from eventbus.model.order import entity_key
from eventbus.store.base import EntityRelease, EntityTake, EventStore, Finish, Finished
from eventbus.store.documents import epoch_ms
from tests.contract.conftest import (
    ERROR,
    FIELDS,
    LEASE,
    SKEW,
    StoreClock,
    near,
    new_key,
)

GUARD_LEASE = timedelta(seconds=30)
ENTITY = {"partnerId": "p-1", "entity_type": "Order", "entity_id": "order-1"}
GIVEN_UP = {"type": "RedriveGivenUp", "message": "cap", "classification": "redrive_cap"}

skews = pytest.mark.parametrize("skew", [-SKEW, timedelta(0), SKEW],
                                ids=["behind", "on-time", "ahead"])


def past(span: timedelta) -> float:
    """Seconds to ``advance`` the store's clock just past ``span``."""
    return (span + timedelta(seconds=1)).total_seconds()


def half(span: timedelta) -> float:
    return span.total_seconds() / 2


def take(keys: tuple[str, ...] = ("k1",), positions: tuple[int, ...] = (1,)) -> EntityTake:
    return EntityTake(ENTITY, keys, positions)


@skews
def test_a_claims_lease_runs_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    key, caller = new_key(), now + skew
    first = store.claim(key, FIELDS, caller)
    record = store.get(key) or {}
    assert near(store_clock, record["lease_until"], now + LEASE)  # not caller + LEASE
    assert record["lastUpdatedTime"] == epoch_ms(caller)  # the caller's now only stamps
    for late in (caller + LEASE * 2, caller - LEASE * 2):  # any caller, early or late
        with pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, late)
        batch = store.claim_many({key: FIELDS, new_key(): FIELDS}, late)
        assert key not in batch.taken and batch.records[key]["lease_owner"] == first.owner
    store_clock.advance(past(LEASE))
    second = store.claim(key, FIELDS, caller)
    assert second.attempt == 2 and second.owner != first.owner
    assert near(store_clock, second.record["lease_until"],
                now + timedelta(seconds=past(LEASE)) + LEASE)


@skews
def test_a_batch_claims_leases_run_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    keys = [new_key(), new_key()]  # new keys: inserted, not claimed by the pipeline
    batch = store.claim_many(dict.fromkeys(keys, FIELDS), now + skew)
    assert set(batch.taken) == set(keys)
    for key in keys:
        assert near(store_clock, batch.taken[key].record["lease_until"], now + LEASE)
        assert batch.taken[key].record["created"] == epoch_ms(now + skew)
    assert store.claim_many(dict.fromkeys(keys, FIELDS), now + skew + LEASE * 2).taken == {}
    store_clock.advance(past(LEASE))
    again = store.claim_many(dict.fromkeys(keys, FIELDS), now + skew - LEASE * 2)
    assert {claim.attempt for claim in again.taken.values()} == {2}


@skews
def test_renew_runs_on_the_stores_clock(store: EventStore, store_clock: StoreClock,
                                        now: datetime, skew: timedelta) -> None:
    key, kept = new_key(), new_key()
    claim = store.claim(key, FIELDS, now)
    batch = store.claim_many({kept: FIELDS, new_key(): FIELDS}, now)
    store_clock.advance(half(LEASE))
    assert store.renew(key, claim.owner, now + skew)
    assert store.renew_many({kept: batch.taken[kept].owner}, now + skew) == {kept}
    for renewed in (key, kept):
        until = (store.get(renewed) or {})["lease_until"]
        assert near(store_clock, until, now + timedelta(seconds=half(LEASE)) + LEASE)
    store_clock.advance(past(LEASE))  # run out, nobody took them: lost all the same
    assert not store.renew(key, claim.owner, now + skew - LEASE * 2)
    assert store.renew_many({kept: batch.taken[kept].owner}, now + skew - LEASE * 2) == set()


@skews
def test_the_finish_fence_runs_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    live, lapsed, batched = new_key(), new_key(), new_key()
    claims = {key: store.claim(key, FIELDS, now) for key in (live, lapsed, batched)}
    store_clock.advance(half(LEASE))
    assert store.renew(live, claims[live].owner, now)
    store_clock.advance(half(LEASE) + 1)  # ``live`` renewed holds, the others ran out
    before = {key: store.get(key) for key in (lapsed, batched)}
    assert store.succeed(live, claims[live].owner, now + skew)
    assert not store.succeed(lapsed, claims[lapsed].owner, now + skew - LEASE * 2)
    assert not store.fail(lapsed, claims[lapsed].owner, now + skew - LEASE * 2, ERROR,
                          retryable=True)
    done = store.finish_many([Finish(batched, claims[batched].owner, unclaim=True)],
                             now + skew - LEASE * 2)
    assert done == Finished(lost=frozenset({batched}))
    assert {key: store.get(key) for key in (lapsed, batched)} == before
    assert (store.get(live) or {})["event_status"] == "SUCCESS"


@skews
def test_entity_take_hold_renew_and_release_run_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    key, held = entity_key("p-1", "Order", new_key()), entity_key("p-1", "Order", new_key())
    first = store.take_entities({key: take()}, now + skew)
    assert first.held(key)
    assert near(store_clock, first.records[key]["holder"]["until"], now + LEASE)
    event = new_key()  # a hold taken by a claim, in the same call
    batch = store.claim_many({event: FIELDS}, now + skew, {held: take((event,), (1,))})
    assert batch.holds is not None and batch.holds.held(held)
    assert near(store_clock, (store.get(held) or {})["holder"]["until"], now + LEASE)
    for late in (now + skew + LEASE * 2, now + skew - LEASE * 2):  # not free to anyone yet
        assert not store.take_entities({key: take(("k2",), (2,)),
                                        held: take(("k2",), (2,))}, late).held(key)
    store_clock.advance(half(LEASE))
    renewed = store.renew_entities({key: first.owner, held: batch.holds.owner},
                                   now + skew - LEASE * 2)
    assert renewed == {key, held}
    until = now + timedelta(seconds=half(LEASE)) + LEASE
    assert near(store_clock, (store.get(key) or {})["holder"]["until"], until)
    store_clock.advance(past(LEASE))  # both holds ran out
    assert store.renew_entities({key: first.owner}, now + skew + LEASE * 2) == set()
    second = store.take_entities({key: take(("k2",), (2,))}, now + skew - LEASE * 2)
    assert second.held(key) and second.records[key]["orphan"]["keys"] == ["k1"]
    before = store.get(key)
    done = store.finish_many([], now + skew + LEASE * 2, [
        EntityRelease(key, first.owner, 1, "k1"),
        EntityRelease(held, batch.holds.owner, 1, event)])
    assert done.unreleased == frozenset({key, held})
    assert store.get(key) == before and "position" not in (store.get(held) or {})
    done = store.finish_many([], now + skew, [EntityRelease(key, second.owner, 2, "k2")])
    assert done == Finished() and (store.get(key) or {})["position"] == 2


@skews
def test_guard_take_and_renew_run_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    key = f"notify:{new_key()}"
    assert store.guard_take(key, "a", now + skew, GUARD_LEASE) is None
    record = store.guard_get(key) or {}
    assert near(store_clock, record["lease_until"], now + GUARD_LEASE)
    for late in (now + skew + GUARD_LEASE * 2, now + skew - GUARD_LEASE * 2):
        with pytest.raises(LeaseHeld):
            store.guard_take(key, "b", late, GUARD_LEASE)
    store_clock.advance(half(GUARD_LEASE))
    assert store.guard_renew(key, "a", GUARD_LEASE)
    until = now + timedelta(seconds=half(GUARD_LEASE)) + GUARD_LEASE
    assert near(store_clock, (store.guard_get(key) or {})["lease_until"], until)
    assert not store.guard_renew(key, "b", GUARD_LEASE)  # not b's to renew
    store_clock.advance(past(GUARD_LEASE))
    assert not store.guard_renew(key, "a", GUARD_LEASE)  # ran out: not brought back
    assert store.guard_take(key, "b", now + skew - GUARD_LEASE * 2, GUARD_LEASE) is None
    assert (store.guard_get(key) or {})["lease_owner"] == "b"


@skews
def test_redrivable_mark_redriven_and_abandon_run_on_the_stores_clock(
        store: EventStore, store_clock: StoreClock, now: datetime, skew: timedelta) -> None:
    # A record whose worker died: not due, not redriven, not given up while its
    # lease is live or only just ran out, whatever the sweeper's clock says;
    # all three once it ran out a lease ago on the store's clock.
    key, failed = new_key(), new_key()
    store.claim(key, FIELDS, now + skew)
    claim = store.claim(failed, FIELDS, now + skew)
    after = now + timedelta(minutes=20)  # a schedule, from the store's clock
    assert store.fail(failed, claim.owner, now + skew, ERROR, retryable=True, redrive_at=after)

    def due() -> set[str]:
        return {record["idempotency_key"] for record in store.redrivable(100)}

    for moment in (0.0, past(LEASE)):
        store_clock.advance(moment)
        assert not {key, failed} & due()
        assert not store.mark_redriven(key, 0, now + skew + LEASE * 10)
        assert not store.abandon(key, now + skew + LEASE * 10, GIVEN_UP)
        assert (store.get(key) or {})["event_status"] == "PROCESSING"
    store_clock.advance(LEASE.total_seconds())  # ran out more than a lease ago
    assert key in due() and failed not in due()
    assert store.mark_redriven(key, 0, now + skew)
    assert store.abandon(key, now + skew - LEASE * 10, GIVEN_UP)
    store_clock.advance(timedelta(minutes=20).total_seconds())
    assert failed in due() and key not in due()
