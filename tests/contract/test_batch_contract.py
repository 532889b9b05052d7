"""The pull worker's batch primitives (claim_many, finish_many, renew_many) on both stores."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from eventbus.partners import documents as partner_documents
from eventbus.store import documents
from eventbus.store.base import Claim, EventStore, Finish, Finished
from tests.contract.conftest import (
    ERROR,
    FIELDS,
    LEASE,
    StoreClock,
    near,
    new_key,
    without_id,
)

OTHER = {**FIELDS, "payload_fingerprint": "another-payload"}


def test_new_keys_are_all_taken_under_one_owner(store: EventStore, now: datetime) -> None:
    keys = [new_key() for _ in range(5)]
    batch = store.claim_many(dict.fromkeys(keys, FIELDS), now)
    assert set(batch.taken) == set(keys) and batch.records == {} and not batch.refused
    assert len({claim.owner for claim in batch.taken.values()}) == 1
    assert {claim.attempt for claim in batch.taken.values()} == {1}
    for key in keys:
        record = store.get(key) or {}
        assert record["event_status"] == "PROCESSING"
        assert record["lease_owner"] == batch.taken[key].owner


def test_finished_held_and_conflicting_keys_come_back_untaken(store: EventStore,
                                                             now: datetime) -> None:
    done, held, retry, fresh = new_key(), new_key(), new_key(), new_key()
    store.succeed(done, store.claim(done, FIELDS, now).owner, now)
    other_owner = store.claim(held, FIELDS, now).owner  # a live lease elsewhere
    store.fail(retry, store.claim(retry, FIELDS, now).owner, now, ERROR, retryable=True)
    batch = store.claim_many({done: FIELDS, held: FIELDS, retry: FIELDS, fresh: FIELDS}, now)
    assert set(batch.taken) == {retry, fresh} and batch.taken[retry].attempt == 2
    assert batch.records[done]["event_status"] == "SUCCESS"
    assert batch.records[held]["lease_owner"] == other_owner
    conflict = store.claim_many({done: OTHER}, now)
    assert conflict.taken == {} and documents.conflicts(conflict.records[done], "another-payload")


def test_an_expired_lease_is_taken_again(store: EventStore, store_clock: StoreClock,
                                         now: datetime) -> None:
    key = new_key()
    first = store.claim_many({key: FIELDS}, now).taken[key]
    later = now + store.lease + timedelta(seconds=1)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    second = store.claim_many({key: FIELDS}, later).taken[key]
    assert second.attempt == 2 and second.owner != first.owner


def test_finish_many_stores_each_outcome_and_names_lost_leases(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    ok, bad, lost = new_key(), new_key(), new_key()
    batch = store.claim_many(dict.fromkeys([ok, bad, lost], FIELDS), now)
    owner = batch.taken[ok].owner
    half = store.lease.total_seconds() / 2
    store_clock.advance(half)
    assert store.renew_many({ok: owner, bad: owner}, now) == {ok, bad}  # not `lost`
    store_clock.advance(half + 1)
    later = now + store.lease + timedelta(seconds=1)
    thief = store.claim(lost, FIELDS, later)  # this batch overran its lease on `lost`
    child = {"idempotency_key": f"{ok}/0:CHILD", "event_type": "CHILD", "status": "PENDING"}
    finishes = [Finish(ok, owner, outbox=(child,)),
                Finish(bad, owner, error=ERROR, retryable=True, redrive_at=later),
                Finish(lost, owner)]
    assert store.finish_many(finishes, later) == Finished(lost=frozenset({lost}))
    assert (store.get(ok) or {})["event_status"] == "SUCCESS"
    assert (store.get(ok) or {})["outbox"][0]["idempotency_key"] == child["idempotency_key"]
    failed = store.get(bad) or {}
    assert (failed["event_status"], failed["retryable"]) == ("FAILED", True)
    assert (store.get(lost) or {})["lease_owner"] == thief.owner  # the other worker's, intact


def test_renew_many_extends_only_the_leases_still_held(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # Taken by another worker, or run out with nobody taking it: either way
    # the lease is not held any more and a renewal does not bring it back.
    kept, lost, lapsed = new_key(), new_key(), new_key()
    batch = store.claim_many({kept: FIELDS, lost: FIELDS, lapsed: FIELDS}, now)
    owner = batch.taken[kept].owner
    half = store.lease.total_seconds() / 2
    store_clock.advance(half)
    assert store.renew_many({kept: owner}, now) == {kept}
    store_clock.advance(half + 1)
    later = now + store.lease + timedelta(seconds=1)
    store.claim(lost, FIELDS, later)
    before = store.get(lapsed)
    assert store.renew_many({kept: owner, lost: owner, lapsed: owner}, later) == {kept}
    assert store.get(lapsed) == before
    record = store.get(kept) or {}
    assert near(store_clock, record["lease_until"], later + store.lease)


def test_a_new_key_claimed_in_a_batch_is_stored_as_a_single_claim_stores_it(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # claim_many inserts new keys as documents (documents.new_record) instead of
    # running the claim's pipeline: the stored record must be the same. (Two
    # keys: a batch of one is the single claim itself.)
    alone, batched = new_key(), new_key()
    store.claim(alone, FIELDS, now)
    store.claim_many({batched: FIELDS, new_key(): FIELDS}, now)
    # The lease ends a lease after the store's now: the server's own (the
    # claim's pipeline) or as this process last read it (the batch's insert).
    skip = {"_id", "idempotency_key", "lease_owner", "lease_until"}
    single = {k: v for k, v in (store.get(alone) or {}).items() if k not in skip}
    batch = {k: v for k, v in (store.get(batched) or {}).items() if k not in skip}
    assert batch == single and single["attempts"] == 1
    assert near(store_clock, (store.get(alone) or {})["lease_until"], now + LEASE)
    assert near(store_clock, (store.get(batched) or {})["lease_until"], now + LEASE)


def test_a_batch_of_new_and_existing_keys_takes_the_claimable_ones(
        store: EventStore, now: datetime) -> None:
    retry, done, fresh = new_key(), new_key(), new_key()
    for key in (retry, done):
        owner = store.claim(key, FIELDS, now).owner
        if key == done:
            store.succeed(key, owner, now)
        else:
            store.fail(key, owner, now, ERROR, retryable=True)
    later = now + timedelta(seconds=1)
    batch = store.claim_many({retry: FIELDS, done: FIELDS, fresh: FIELDS}, later)
    assert set(batch.taken) == {retry, fresh} and set(batch.records) == {done}
    assert (batch.taken[retry].attempt, batch.taken[fresh].attempt) == (2, 1)
    assert (store.get(retry) or {})["entity_metadata"]["resilienceAttemptCount"].keys() == \
        {"1", "2"}


def test_a_batch_of_one_answers_as_the_single_key_primitives(store: EventStore,
                                                             now: datetime) -> None:
    # Push hands the processor a batch of one: taken, held, conflicting and
    # finished keys come back exactly as for a batch of many.
    fresh, held = new_key(), new_key()
    taken = store.claim_many({fresh: FIELDS}, now).taken[fresh]
    other = store.claim(held, FIELDS, now).owner
    assert store.claim_many({held: FIELDS}, now).records[held]["lease_owner"] == other
    assert store.finish_many([Finish(fresh, taken.owner)], now) == Finished()
    assert store.finish_many([Finish(held, taken.owner)], now) == Finished(
        lost=frozenset({held}))
    conflict = store.claim_many({fresh: OTHER}, now)
    assert conflict.taken == {} and documents.conflicts(conflict.records[fresh], "another-payload")
    assert (store.get(fresh) or {})["event_status"] == "SUCCESS"


# -- Claim.record: one meaning on every path ----------------------------------------------------
PARKED = {"type": "BreakerOpen", "message": "open", "classification": "parked",
          "partner": "acme"}


def _claim_one(store: EventStore, key: str, now: datetime) -> Claim:
    return store.claim(key, FIELDS, now)


def _batch_of_one(store: EventStore, key: str, now: datetime) -> Claim:
    return store.claim_many({key: FIELDS}, now).taken[key]


def _batch_of_three(store: EventStore, key: str, now: datetime) -> Claim:
    batch = store.claim_many({key: FIELDS, new_key(): FIELDS, new_key(): FIELDS}, now)
    assert len(batch.taken) == 3
    return batch.taken[key]


CLAIMS: dict[str, Callable[[EventStore, str, datetime], Claim]] = {
    "claim": _claim_one, "claim_many of 1": _batch_of_one, "claim_many of 3": _batch_of_three}


@pytest.mark.parametrize("state", ["new", "failed retryable", "parked", "expired lease"])
@pytest.mark.parametrize("path", list(CLAIMS))
def test_claim_record_is_the_record_as_the_claim_left_it_on_every_path(
        store: EventStore, store_clock: StoreClock, now: datetime, path: str,
        state: str) -> None:
    # Claim.record means one thing on every store and batch size: the record
    # after the claim (its lease, attempt and attempt map included), with what
    # a claim never changes (the park count) still in it.
    key = new_key()
    if state != "new":
        first = store.claim(key, FIELDS, now)
        if state == "expired lease":
            store_clock.advance((LEASE + timedelta(seconds=1)).total_seconds())
        else:
            error = {**PARKED, "until": now} if state == "parked" else ERROR
            assert store.finish_many([Finish(key, first.owner, error=error, retryable=True,
                                             redrive_at=now, parked=state == "parked")],
                                     now) == Finished()
    claim = CLAIMS[path](store, key, now)
    stored = store.get(key)
    assert stored is not None
    assert without_id(claim.record) == without_id(stored)
    assert claim.record["lease_owner"] == claim.owner
    assert claim.record["event_status"] == "PROCESSING"
    assert claim.record["attempts"] == claim.attempt == (1 if state == "new" else 2)
    assert str(claim.attempt) in claim.record["entity_metadata"]["resilienceAttemptCount"]
    assert "error" not in claim.record and "retryable" not in claim.record
    assert near(store_clock, claim.record["lease_until"], store.now() + LEASE)
    assert partner_documents.parks(claim.record) == (1 if state == "parked" else 0)


def test_a_parks_count_survives_a_claim_an_unclaim_and_a_failure(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # Parks are counted in the record's top-level ``parks`` (``$inc`` by a
    # parked finish), where no claim, unclaim or failure erases them.
    key = new_key()
    for count in (1, 2):
        claim = store.claim(key, FIELDS, now)
        assert store.finish_many([Finish(key, claim.owner, error={**PARKED, "until": now},
                                         retryable=True, redrive_at=now, parked=True)],
                                 now) == Finished()
        assert (store.get(key) or {})["parks"] == count
    claim = store.claim(key, FIELDS, now)
    assert claim.record["parks"] == 2 and (store.get(key) or {})["parks"] == 2
    assert store.finish_many([Finish(key, claim.owner, unclaim=True)], now) == Finished()
    assert (store.get(key) or {})["parks"] == 2  # handed back: PENDING, still counted
    claim = store.claim_many({key: FIELDS, new_key(): FIELDS}, now).taken[key]
    assert claim.record["parks"] == 2
    assert store.fail(key, claim.owner, now, ERROR, retryable=True)
    record = store.get(key) or {}
    assert (record["event_status"], record["parks"], partner_documents.parks(record)) == \
        ("FAILED", 2, 2)
    claim = store.claim(key, FIELDS, now)  # a claim whose worker then dies
    store_clock.advance((LEASE * 3).total_seconds())
    assert partner_documents.parks(store.claim(key, FIELDS, now).record) == 2
