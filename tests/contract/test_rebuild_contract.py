"""The rebuild primitives (``RebuildStore``) on both stores: lease, renew, finish, run documents.

A rebuild leases SUCCESS records without touching their status; one record
is leased once per rebuild id (an audit entry of that id refuses it); every
write under the lease is fenced on the store's clock.
"""

from __future__ import annotations

from datetime import datetime

from eventbus.store.base import EventStore, Finish
from eventbus.store.documents import FAILED, SUCCESS
from tests.contract.conftest import ERROR, FIELDS, LEASE, StoreClock, new_key
from tests.run_stores import runs_of


def _success(store: EventStore, now: datetime, outbox: tuple[dict[str, object], ...] = ()) -> str:
    key = new_key()
    claim = store.claim(key, FIELDS, now)
    assert store.succeed(key, claim.owner, now, list(outbox))
    return key


def _records(store: EventStore, *keys: str) -> dict[str, dict[str, object]]:
    return {key: store.get(key) or {} for key in keys}


def test_a_rebuild_leases_success_records_only_and_leaves_their_status(
        store: EventStore, now: datetime) -> None:
    done, done_too = _success(store, now), _success(store, now)
    failed = new_key()
    claim = store.claim(failed, FIELDS, now)
    store.fail(failed, claim.owner, now, ERROR, retryable=False)
    batch = store.rebuild_claim_many(_records(store, done, done_too, failed), "rb-1", now)
    assert set(batch.taken) == {done, done_too}
    assert batch.records[failed]["event_status"] == FAILED
    owners = {claim.owner for claim in batch.taken.values()}
    assert len(owners) == 1
    for key in (done, done_too):
        record = store.get(key)
        assert record is not None and record["event_status"] == SUCCESS
        assert record["rebuild_lease"]["owner"] in owners
        assert batch.taken[key].record["rebuild_lease"]["owner"] in owners
    # A second lease of a leased record is refused while the first holds.
    again = store.rebuild_claim_many(_records(store, done), "rb-2", now)
    assert again.taken == {} and done in again.records


def test_the_finish_appends_the_audit_and_new_children_and_a_rebuild_runs_a_record_once(
        store: EventStore, now: datetime) -> None:
    child = {"idempotency_key": "c-0", "status": "PUBLISHED"}
    key = _success(store, now, (child,))
    claim = store.rebuild_claim_many(_records(store, key), "rb-1", now).taken[key]
    new = {"idempotency_key": "c-1", "status": "PENDING"}
    done = store.rebuild_finish_many([Finish(key, claim.owner, outbox=(new,),
                                             audit={"rebuild": "rb-1", "outcome": "rebuilt"})],
                                     now)
    assert done.lost == frozenset()
    record = store.get(key)
    assert record is not None and record["event_status"] == SUCCESS
    assert [c["idempotency_key"] for c in record["outbox"]] == ["c-0", "c-1"]
    assert [e["rebuild"] for e in record["replays"]] == ["rb-1"]
    assert "rebuild_lease" not in record
    # The same rebuild never leases it again (a resume); another rebuild may.
    assert store.rebuild_claim_many(_records(store, key), "rb-1", now).taken == {}
    assert key in store.rebuild_claim_many(_records(store, key), "rb-2", now).taken


def test_a_lapsed_rebuild_lease_stores_nothing_and_renewals_keep_a_live_one(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    kept, lapsing = _success(store, now), _success(store, now)
    batch = store.rebuild_claim_many(_records(store, kept, lapsing), "rb-1", now)
    owner = batch.taken[kept].owner
    store_clock.advance(LEASE.total_seconds() / 2)
    assert store.rebuild_renew_many({kept: owner}, now) == {kept}
    store_clock.advance(LEASE.total_seconds() / 2 + 2)
    assert store.rebuild_renew_many({lapsing: owner}, now) == set()
    done = store.rebuild_finish_many(
        [Finish(kept, owner, audit={"rebuild": "rb-1"}),
         Finish(lapsing, owner, audit={"rebuild": "rb-1"})], now)
    assert done.lost == frozenset({lapsing})
    assert "replays" not in (store.get(lapsing) or {})
    assert [e["rebuild"] for e in (store.get(kept) or {})["replays"]] == ["rb-1"]
    # A lapsed lease frees the record for the next rebuild.
    assert lapsing in store.rebuild_claim_many(_records(store, lapsing), "rb-2", now).taken


def test_a_given_back_lease_leaves_the_record_as_it_was(store: EventStore,
                                                        now: datetime) -> None:
    key = _success(store, now)
    before = store.get(key)
    owner = store.rebuild_claim_many(_records(store, key), "rb-1", now).taken[key].owner
    done = store.rebuild_finish_many([Finish(key, owner, unclaim=True)], now)
    assert done.lost == frozenset()
    after = store.get(key)
    assert after is not None and before is not None
    assert {k: v for k, v in after.items() if k != "_id"} == \
        {k: v for k, v in before.items() if k != "_id"}
    assert key in store.rebuild_claim_many(_records(store, key), "rb-1", now).taken


def test_run_documents_are_saved_read_back_and_listed_newest_first(
        store: EventStore, now: datetime) -> None:
    for number in (1, 2):
        runs_of(store).rebuild_save({"rebuild_id": f"rb-{number}", "started": f"2026-0{number}",
                            "status": "running", "counts": {"rebuilt": number}})
    runs_of(store).rebuild_save({"rebuild_id": "rb-1", "started": "2026-01", "status": "finished",
                        "counts": {"rebuilt": 5}})
    found = runs_of(store).rebuild_get("rb-1")
    assert found is not None and found["status"] == "finished"
    assert found["counts"] == {"rebuilt": 5}
    assert [run["rebuild_id"] for run in runs_of(store).rebuild_runs(10)] == ["rb-2", "rb-1"]
    assert runs_of(store).rebuild_get("rb-none") is None


def test_a_plan_is_stored_in_order_across_pages_replaced_and_never_listed_as_a_run(
        store: EventStore) -> None:
    # Keys of 600 characters: three pages of 1 MiB hold the 5,000 (rebuilds.plan_pages).
    plan = [f"k{number:05d}-" + "x" * 593 for number in range(5000)]
    runs_of(store).rebuild_save({"rebuild_id": "rb-plan", "started": "2026-03",
                                 "status": "running"})
    assert runs_of(store).rebuild_plan("rb-plan") is None
    runs_of(store).rebuild_plan_save("rb-plan", plan)
    assert runs_of(store).rebuild_plan("rb-plan") == plan
    runs_of(store).rebuild_plan_save("rb-plan", ["k-b", "k-a"])  # a second plan replaces every page
    assert runs_of(store).rebuild_plan("rb-plan") == ["k-b", "k-a"]
    runs_of(store).rebuild_plan_save("rb-other", [])
    assert runs_of(store).rebuild_plan("rb-other") == []
    assert [run["rebuild_id"] for run in runs_of(store).rebuild_runs(10)] == ["rb-plan"]


def test_a_new_records_live_finish_keeps_its_audit_entry_succeeded_or_failed(
        store: EventStore, now: datetime) -> None:
    # An archive rebuild's new records: the live claim and finish, with ``replays`` as extra.
    made, refused = new_key(), new_key()
    batch = store.claim_many({made: FIELDS, refused: FIELDS}, now)
    entry = {"by": "ops", "why": "$restore", "rebuild": "rb-9", "outcome": "rebuilt",
             "source": "archive", "new_record": True}
    failed = {**entry, "outcome": "failed", "error": ERROR}
    done = store.finish_many([
        Finish(made, batch.taken[made].owner, extra={"replays": [entry]}),
        Finish(refused, batch.taken[refused].owner, error=ERROR, retryable=False,
               extra={"replays": [failed]})], now)
    assert not done.lost and not done.refused
    record, failure = store.get(made) or {}, store.get(refused) or {}
    assert record["event_status"] == SUCCESS and record["replays"] == [entry]
    assert failure["event_status"] == FAILED and failure["retryable"] is False
    assert failure["replays"] == [failed] and failure["error"]["type"] == ERROR["type"]
