"""The pull worker's batch primitives (claim_many, finish_many, renew_many) on both stores."""

from __future__ import annotations

from datetime import datetime, timedelta

from eventbus.store import documents
from eventbus.store.base import EventStore, Finish, Finished
from tests.contract.conftest import ERROR, FIELDS, new_key

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


def test_an_expired_lease_is_taken_again(store: EventStore, now: datetime) -> None:
    key = new_key()
    first = store.claim_many({key: FIELDS}, now).taken[key]
    later = now + store.lease + timedelta(seconds=1)
    second = store.claim_many({key: FIELDS}, later).taken[key]
    assert second.attempt == 2 and second.owner != first.owner


def test_finish_many_stores_each_outcome_and_names_lost_leases(store: EventStore,
                                                              now: datetime) -> None:
    ok, bad, lost = new_key(), new_key(), new_key()
    batch = store.claim_many(dict.fromkeys([ok, bad, lost], FIELDS), now)
    owner = batch.taken[ok].owner
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


def test_renew_many_extends_only_the_leases_still_held(store: EventStore,
                                                      now: datetime) -> None:
    kept, lost = new_key(), new_key()
    batch = store.claim_many({kept: FIELDS, lost: FIELDS}, now)
    owner = batch.taken[kept].owner
    later = now + store.lease + timedelta(seconds=1)
    store.claim(lost, FIELDS, later)
    assert store.renew_many({kept: owner, lost: owner}, later) == {kept}
    record = store.get(kept) or {}
    assert record["lease_until"] == documents.bson_time(later + store.lease)


def test_a_new_key_claimed_in_a_batch_is_stored_as_a_single_claim_stores_it(
        store: EventStore, now: datetime) -> None:
    # claim_many inserts new keys as documents (documents.new_record) instead of
    # running the claim's pipeline: the stored record must be the same. (Two
    # keys: a batch of one is the single claim itself.)
    alone, batched = new_key(), new_key()
    store.claim(alone, FIELDS, now)
    store.claim_many({batched: FIELDS, new_key(): FIELDS}, now)
    skip = {"_id", "idempotency_key", "lease_owner"}
    single = {k: v for k, v in (store.get(alone) or {}).items() if k not in skip}
    batch = {k: v for k, v in (store.get(batched) or {}).items() if k not in skip}
    assert batch == single and single["attempts"] == 1


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
