"""The guard's fence and hold, on both stores: the cases mutation testing found untested.

``infra/mutation.sh`` (issue 39, ``docs/mutation.md``) changed the guard and the
store's guard records one token at a time; these tests state the behaviour that a
surviving change broke: what ``Guarded`` says, which owner the keeper renews, that a
failed effect gives its key back at once with its own error, the SUCCESS write's
bounds (tries and half a lease), the held results of the async form and their cap,
the replay guard, and ``guard_renew``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from eventbus.guard import Guard, Guarded, ReplayGuard
from eventbus.model.errors import (
    AlreadyExists,
    Conflict,
    LeaseHeld,
    PermanentError,
    ReplayRefused,
    StoreUnavailable,
)
from eventbus.model.order import entity_key
from eventbus.store import documents
from eventbus.store.base import EntityRelease, EntityTake, EventStore
from eventbus.store.documents import REJECTED
from eventbus.store.memory import MemoryEventStore
from tests import aio
from tests.contract.conftest import (
    ERROR,
    FIELDS,
    LEASE,
    StoreClock,
    almost,
    caller_clock,
    near,
    new_key,
    put_raw,
)
from tests.contract.test_guard_store_errors import RESULT, Failover, Partner, Waits, guard
from tests.logged import logged

FORMS = ["sync", "async"]


def run(form: str, here: Guard, key: str, partner: Partner, **options: Any) -> Guarded:
    """One delivery of ``key`` through ``here``, by ``run`` or by ``run_async``."""
    if form == "sync":
        return here.run(key, partner, **options)
    return aio.run(here.run_async(key, partner.call_async, **options))


def failing(store: EventStore, fails: int = 2) -> Any:
    """``store`` whose first ``fails`` SUCCESS writes of the guard meet a failover."""
    return Failover(store, fails=fails)


def by_kind(exc: BaseException) -> str:
    """A classifier that reads the error (a permanent error is permanent)."""
    return "permanent" if isinstance(exc, PermanentError) else "transient"


class Renewing:
    """A keeper that renews the lease it is given on the store, as the processor's heartbeat
    does, and records what it was given and whether the renewal took."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.kept: list[tuple[str, str]] = []
        self.renewed: list[bool] = []

    @contextlib.contextmanager
    def __call__(self, key: str, owner: str) -> Iterator[None]:
        self.kept.append((key, owner))
        self.renewed.append(self.store.guard_renew(key, owner, LEASE))
        yield


@pytest.mark.parametrize("form", FORMS)
def test_guarded_says_which_key_what_result_and_whether_it_ran(
        store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    first = run(form, guard(store, clock), key, partner)
    again = run(form, guard(store, clock), key, partner)
    assert (first.key, dict(first.result), first.skipped) == (key, RESULT, False)
    assert (again.key, dict(again.result), again.skipped) == (key, RESULT, True)
    assert again.skipped is True and first.skipped is False
    assert partner.calls == 1


@pytest.mark.parametrize("form", FORMS)
def test_the_keeper_is_given_the_lease_the_store_holds_and_renews_it(
        store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    keeper = Renewing(store)
    here = Guard(store, lease=LEASE, now=clock, keep=keeper)
    run(form, here, key, partner)
    run(form, here, other := new_key(), partner)
    assert [kept for kept, _ in keeper.kept] == [key, other]
    assert keeper.renewed == [True, True]
    owners = [owner for _, owner in keeper.kept]
    assert all(isinstance(owner, str) and owner for owner in owners) and owners[0] != owners[1]


@pytest.mark.parametrize("form", FORMS)
def test_a_duplicate_delivery_while_the_effect_runs_is_refused(
        store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
    clock, key = caller_clock(store_clock, now), new_key()
    duplicate = Partner()
    refused: list[type[BaseException]] = []

    class During(Partner):
        def __call__(self) -> dict[str, Any]:
            try:
                guard(store, clock).run(key, duplicate)
            except LeaseHeld as exc:
                refused.append(type(exc))
            return super().__call__()
    done = run(form, guard(store, clock), key, During())
    assert (done.skipped, refused, duplicate.calls) == (False, [LeaseHeld], 0)


@pytest.mark.parametrize("form", FORMS)
def test_a_failed_effect_gives_its_key_back_at_once_with_its_own_error(
        store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
    clock, key = caller_clock(store_clock, now), new_key()
    partner = Partner(PermanentError("partner refused the order"))
    with pytest.raises(PermanentError):
        run(form, guard(store, clock), key, partner, classify=by_kind)
    record = store.guard_get(key) or {}
    assert record["status"] == "FAILED" and "lease_owner" not in record
    assert record["error"] == {"type": "PermanentError", "message": "partner refused the order",
                               "classification": "permanent"}
    # Released, not left to lapse: the next delivery takes the key at once.
    again = run(form, guard(store, clock), key, partner, classify=by_kind)
    assert (again.skipped, dict(again.result), partner.calls) == (False, RESULT, 2)


def test_the_success_write_is_tried_retry_tries_times_at_most(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=1000), Waits()
    with pytest.raises(StoreUnavailable):
        guard(down, clock, waits).run(key, partner)
    assert len(down.writes) == Guard.retry_tries  # well within half a lease (9.15 s of 30)
    assert len(waits.delays) == Guard.retry_tries - 1


@pytest.mark.parametrize("start", [0.0, 5000.0], ids=["monotonic-0", "monotonic-5000"])
def test_the_success_writes_spend_at_most_half_a_lease(
        store: EventStore, store_clock: StoreClock, now: datetime, start: float) -> None:
    # Two-second waits against a 30-second budget: the last write may land right at it.
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=1000), Waits()
    waits.elapsed = start  # a monotonic clock counts from anywhere
    here = guard(down, clock, waits)
    here.retry_tries, here.retry_first, here.retry_cap = 1000, 2.0, 2.0
    with pytest.raises(StoreUnavailable):
        here.run(key, partner)
    assert sum(waits.delays) == LEASE.total_seconds() / 2
    assert len(down.writes) == len(waits.delays) + 1


def test_the_backoff_grows_to_its_cap_within_half_a_lease(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down, waits = Failover(store, fails=1000), Waits()
    here = guard(down, clock, waits)
    here.retry_tries = 1000
    with pytest.raises(StoreUnavailable):
        here.run(key, partner)
    budget = LEASE.total_seconds() / 2
    assert budget - Guard.retry_cap < sum(waits.delays) <= budget
    assert max(waits.delays) == Guard.retry_cap


def test_the_guards_log_names_the_key_the_write_and_the_store_error(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key = caller_clock(store_clock, now), new_key()
    failed = new_key()
    with logged("eventbus.guard") as records:
        with pytest.raises(StoreUnavailable):
            guard(Failover(store, fails=1000), clock).run(key, Partner())
        with pytest.raises(PermanentError):
            guard(Failover(store, fails=1, succeeded=False), clock).run(
                failed, Partner(PermanentError("refused")))
    lines = [(record.levelno, record.getMessage()) for record in records]
    retries = [text for level, text in lines if level == logging.INFO]
    warnings = [text for level, text in lines if level == logging.WARNING]
    assert len(retries) == Guard.retry_tries - 1 and len(warnings) == 2
    assert all(key in text and "primary stepped down" in text for text in retries)
    assert "write 1 " in retries[0] and "in 0.05s" in retries[0] and "in 0.1s" in retries[1]
    assert key in warnings[0] and f"after {Guard.retry_tries} writes" in warnings[0]
    assert "primary stepped down" in warnings[0]
    assert failed in warnings[1] and "primary stepped down" in warnings[1]


def test_run_async_out_of_retries_holds_the_result_for_its_next_run(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down = Failover(store, fails=1000)
    here = guard(down, clock)
    with pytest.raises(StoreUnavailable):
        aio.run(here.run_async(key, partner.call_async))
    clock.advance(LEASE.total_seconds() * 2)  # the lease lapsed: only the held result stops a call
    down.fails = 0
    again = aio.run(here.run_async(key, partner.call_async))
    assert (again.key, dict(again.result), again.skipped, partner.calls) == (key, RESULT, True, 1)
    record = store.guard_get(key) or {}
    assert (record["status"], record["result"]) == ("SUCCESS", RESULT)


@pytest.mark.parametrize("form", FORMS)
def test_a_held_result_is_written_once_then_read_from_the_store(
        store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down = Failover(store, fails=1000)
    here = guard(down, clock)
    with pytest.raises(StoreUnavailable):
        run(form, here, key, partner)
    down.fails, down.writes[:] = 0, []
    stored = run(form, here, key, partner)
    assert (stored.key, dict(stored.result), stored.skipped, down.writes) == (
        key, RESULT, True, [True])
    later = run(form, here, key, partner)  # read from the store: no write, no call
    assert (later.skipped, down.writes, partner.calls) == (True, [True], 1)


def test_a_redelivery_while_a_held_result_is_written_is_skipped_too(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
    down = Failover(store, fails=1000)
    here = guard(down, clock)
    with pytest.raises(StoreUnavailable):
        here.run(key, partner)
    down.fails = 0
    nested: list[Guarded] = []

    def redelivered() -> None:
        if not nested:
            nested.append(Guarded(key, {}, skipped=False))  # once: this write's own redelivery
            nested[0] = here.run(key, partner)
    down.before_write = redelivered
    done = here.run(key, partner)
    assert (done.skipped, nested[0].skipped, partner.calls) == (True, True, 1)


def test_the_held_results_keep_the_newest_up_to_their_cap(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    clock, partner = caller_clock(store_clock, now), Partner()
    down = Failover(store, fails=10 ** 6)
    here = guard(down, clock)
    here.held_cap = 2
    keys = [new_key() for _ in range(3)]
    for key in keys:
        with pytest.raises(StoreUnavailable):
            here.run(key, partner)
    clock.advance(LEASE.total_seconds() * 2)  # every lease lapsed: a dropped key runs again
    down.fails = 0
    done = [here.run(key, partner).skipped for key in keys]
    assert (done, partner.calls) == ([False, True, True], 4)


class TestReplayGuard:
    """``ReplayGuard``: a stored SUCCESS is returned, a call never made is refused or run."""

    @pytest.mark.parametrize("form", FORMS)
    def test_a_stored_success_is_returned_without_a_call(
            self, store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
        clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
        run(form, guard(store, clock), key, partner)
        replay = ReplayGuard(store, lease=LEASE, now=clock)
        done = run(form, replay, key, partner)
        assert (done.key, dict(done.result), done.skipped, partner.calls) == (
            key, RESULT, True, 1)

    @pytest.mark.parametrize("form", FORMS)
    def test_a_call_never_made_is_refused(
            self, store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
        clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
        with pytest.raises(ReplayRefused, match="--allow-new-calls") as refused:
            run(form, ReplayGuard(store, lease=LEASE, now=clock), key, partner)
        assert key in str(refused.value) and "never succeeded" in str(refused.value)
        assert partner.calls == 0 and store.guard_get(key) is None

    @pytest.mark.parametrize("form", FORMS)
    def test_a_failed_call_is_refused_too(
            self, store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
        clock, key = caller_clock(store_clock, now), new_key()
        with pytest.raises(PermanentError):
            run(form, guard(store, clock), key, Partner(PermanentError("no")))
        with pytest.raises(ReplayRefused):
            run(form, ReplayGuard(store, lease=LEASE, now=clock), key, Partner())

    @pytest.mark.parametrize("form", FORMS)
    def test_new_calls_run_as_live_with_the_replays_keeper_and_classifier(
            self, store: EventStore, store_clock: StoreClock, now: datetime, form: str) -> None:
        clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
        keeper, waits = Renewing(store), Waits()
        replay = ReplayGuard(store, lease=LEASE, now=clock, keep=keeper, new_calls=True,
                             sleep=waits.sleep, monotonic=waits.monotonic)
        done = run(form, replay, key, partner)
        assert (done.key, dict(done.result), done.skipped, partner.calls) == (
            key, RESULT, False, 1)
        assert [kept for kept, _ in keeper.kept] == [key] and keeper.renewed == [True]
        assert replay.lease == LEASE and replay.now is clock
        failed = new_key()
        with pytest.raises(PermanentError):
            run(form, replay, failed, Partner(PermanentError("no")), classify=by_kind)
        assert (store.guard_get(failed) or {})["error"]["classification"] == "permanent"
        assert run(form, replay, key, partner).skipped is True

    def test_the_replays_success_writes_wait_on_its_own_sleeper_and_clock(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        clock, key, partner = caller_clock(store_clock, now), new_key(), Partner()
        waits = Waits()
        replay = ReplayGuard(failing(store), lease=LEASE, now=clock, new_calls=True,
                             sleep=waits.sleep, monotonic=waits.monotonic)
        assert replay.run(key, partner).skipped is False
        assert waits.delays == [0.05, 0.1]
        # A clock on which half a lease passed at the first failed write: no retry.
        ticks, late = iter([0.0, LEASE.total_seconds()]), Waits()
        replay = ReplayGuard(failing(store), lease=LEASE, now=clock, new_calls=True,
                             sleep=late.sleep, monotonic=lambda: next(ticks))
        with pytest.raises(StoreUnavailable):
            replay.run(new_key(), partner)
        assert late.delays == []


class TestGuardRenew:
    """``guard_renew``: only the lease's owner, only while it holds, only while PROCESSING."""

    def test_the_owner_extends_a_live_lease_from_the_stores_now(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        assert store.guard_take(key, "a", now, LEASE) is None
        store_clock.advance(almost(store_clock, LEASE / 2))
        assert store.guard_renew(key, "a", LEASE)
        record = store.guard_get(key) or {}
        expected = now + timedelta(seconds=almost(store_clock, LEASE / 2)) + LEASE
        assert near(store_clock, record["lease_until"], expected)
        assert (record["status"], record["lease_owner"]) == ("PROCESSING", "a")
        assert store.guard_renew(key, "a", LEASE * 2)
        longer = (store.guard_get(key) or {})["lease_until"]
        assert near(store_clock, longer, expected + LEASE)

    def test_another_owner_a_lapsed_lease_a_finished_key_or_none_is_not_renewed(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key, done, gone = new_key(), new_key(), new_key()
        assert store.guard_take(key, "a", now, LEASE) is None
        assert not store.guard_renew(key, "b", LEASE)
        assert store.guard_take(done, "a", now, LEASE) is None
        store.guard_finish(done, "a", now, succeeded=True, result=RESULT)
        assert not store.guard_renew(done, "a", LEASE)
        assert not store.guard_renew(gone, "a", LEASE)
        before = (store.guard_get(key) or {})["lease_until"]
        store_clock.advance(LEASE.total_seconds() + 2)
        assert not store.guard_renew(key, "a", LEASE)
        assert (store.guard_get(key) or {})["lease_until"] == before  # not brought back
        assert store.guard_take(key, "b", now, LEASE) is None  # lapsed: taken by another
        assert not store.guard_renew(key, "a", LEASE) and store.guard_renew(key, "b", LEASE)



# -- the claim rule on fingerprints and rejected records, on both stores ---------------------

MISSING = object()
FP_A, FP_B = "fp-a" * 16, "fp-b" * 16
REFUSED = {"event_status": "FAILED", REJECTED: True, "retryable": False,
           "payload_fingerprint": FP_A, "payload_sha256": "sha", "payload_size": 3,
           "error": ERROR}
CASES = [
    # (the record before, the claim's fingerprint, taken / "exists" / "conflict")
    (REFUSED, FP_B, "taken"),  # a corrected payload takes its refused record
    (REFUSED, FP_A, "exists"),  # the same payload is a duplicate
    (REFUSED, "", "exists"),  # no fingerprint: never a correction
    ({**REFUSED, "payload_fingerprint": MISSING}, FP_B, "taken"),
    ({**REFUSED, "event_status": "PENDING"}, FP_B, "conflict"),  # no longer a refusal
    ({"event_status": "PENDING", "payload_fingerprint": FP_A}, FP_B, "conflict"),
    ({"event_status": "PENDING", "payload_fingerprint": FP_A}, "", "taken"),
    ({"event_status": "PENDING", "payload_fingerprint": FP_A}, FP_A, "taken"),
    ({"event_status": "PENDING"}, FP_B, "taken"),
    ({"event_status": "", "payload_fingerprint": FP_A}, FP_B, "taken"),  # holds no event yet
    ({"event_status": "SUCCESS", "payload_fingerprint": FP_A}, FP_B, "conflict"),
    ({"event_status": "SUCCESS", "payload_fingerprint": FP_A}, FP_A, "exists"),
    ({"event_status": "FAILED", "retryable": True, "payload_fingerprint": FP_A}, FP_A, "taken"),
    ({"event_status": "FAILED", "retryable": True, "payload_fingerprint": FP_A}, FP_B,
     "conflict"),
]


def put_changed(store: EventStore, key: str, changes: dict[str, Any]) -> None:
    """Rewrite ``key``'s record with ``changes``, as another tool would (``put_raw``)."""
    record = {name: value for name, value in (store.get(key) or {}).items() if name != "_id"}
    if isinstance(store, MemoryEventStore):
        put_raw(store, {**record, **changes})
        return
    store.collection.delete_one({"idempotency_key": key})  # type: ignore[attr-defined]
    put_raw(store, {**record, **changes})


def _claim_fields(fingerprint: str) -> dict[str, Any]:
    fields = {name: value for name, value in FIELDS.items() if name != "payload_fingerprint"}
    return {**fields, "payload_fingerprint": fingerprint} if fingerprint else fields


@pytest.mark.parametrize(("before", "fingerprint", "expected"), CASES)
def test_a_claim_takes_refuses_or_conflicts_by_its_fingerprint(
        store: EventStore, now: datetime, before: dict[str, Any], fingerprint: str,
        expected: str) -> None:
    key = new_key()
    put_raw(store, {"idempotency_key": key, **{name: value for name, value in before.items()
                                               if value is not MISSING}})
    stored = store.get(key)
    try:
        store.claim(key, _claim_fields(fingerprint), now)
        outcome = "taken"
    except Conflict:
        outcome = "conflict"
    except AlreadyExists:
        outcome = "exists"
    assert outcome == expected
    assert documents.conflicts(stored, fingerprint) is (expected == "conflict")
    assert documents.claimable(stored, store.now(), fingerprint) is (expected == "taken")


def test_a_corrected_payload_keeps_each_refusal_and_drops_what_described_it(
        store: EventStore, now: datetime) -> None:
    key = new_key()
    put_raw(store, {"idempotency_key": key, **REFUSED})
    first = store.claim(key, _claim_fields(FP_B), now)
    after = store.get(key) or {}
    assert after["rejections"] == [{"error": ERROR, "payload_fingerprint": FP_A,
                                    "payload_sha256": "sha", "payload_size": 3}]
    assert not {REJECTED, "payload_sha256", "payload_size", "raw_payload"} & set(after)
    assert after["payload_fingerprint"] == FP_B
    # Refused again, then corrected again: both refusals are kept, in order.
    assert first.attempt == 1
    put_changed(store, key, {REJECTED: True, "event_status": "FAILED", "retryable": False,
                             "error": ERROR})
    store.claim(key, _claim_fields("fp-c" * 16), now)
    rejections = (store.get(key) or {})["rejections"]
    assert [entry["payload_fingerprint"] for entry in rejections] == [FP_A, FP_B]
    # A claim that is no correction (a retry) keeps the refusals as they are.
    put_changed(store, key, {"event_status": "FAILED", "retryable": True})
    store.claim(key, _claim_fields("fp-c" * 16), now)
    assert (store.get(key) or {})["rejections"] == rejections


def test_a_claim_clears_a_given_back_events_redrive_time(store: EventStore,
                                                         now: datetime) -> None:
    key = new_key()
    put_raw(store, {"idempotency_key": key, "event_status": "PENDING",
                    "redrive_at": now + timedelta(minutes=20), "payload_fingerprint": FP_A})
    store.claim(key, _claim_fields(FP_A), now)
    after = store.get(key) or {}
    assert after["event_status"] == "PROCESSING" and "redrive_at" not in after


def test_fields_without_pubsub_claim_an_existing_record_with_an_empty_pubsub(
        store: EventStore, now: datetime) -> None:
    key = new_key()
    put_raw(store, {"idempotency_key": key, "event_status": "PENDING",
                    "pubsub": {"message_id": "old"}})
    fields = {name: value for name, value in FIELDS.items() if name != "pubsub"}
    store.claim(key, fields, now)
    assert (store.get(key) or {})["pubsub"] == {}


# -- entity records: their audit fields, a take that does not hold, the hold's edges ---------

ENTITY = {"partnerId": "p-1", "entity_type": "Order", "entity_id": "order-1"}


def stamped(record: dict[str, Any]) -> datetime:
    """The time of ``record``'s ``lastUpdatedTime`` (epoch-ms text)."""
    return documents.EPOCH + timedelta(milliseconds=int(record["lastUpdatedTime"]))


def entity_take(keys: tuple[str, ...] = ("k1",), positions: tuple[Any, ...] = (1,),
                kind: str = "") -> EntityTake:
    return EntityTake(ENTITY, keys, positions, kind)


def fresh_entity() -> str:
    return entity_key("p-1", "Order", new_key())


def test_an_entity_record_says_when_it_changed_and_when_its_position_was_applied(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: entity_take()}, now)
    record = store.get(key) or {}
    assert near(store_clock, stamped(record), now)  # a take stamps the store's now
    assert record["entity"] == ENTITY and not any(name.startswith("__") for name in record)
    released_at = now + timedelta(seconds=3)
    store.finish_many([], released_at, [EntityRelease(key, first.owner, 4, "k1")])
    record = store.get(key) or {}
    assert record["lastUpdatedTime"] == documents.epoch_ms(released_at)
    assert (record["position"], record["applied_key"]) == (4, "k1")
    assert record["applied_at"] == documents.bson_time(released_at)
    # A release at the same position (another event there) or behind it applies nothing.
    for position in (4, 2):
        later = released_at + timedelta(seconds=position)
        holds = store.take_entities({key: entity_take(("k2",), (position,))}, later)
        store.finish_many([], later, [EntityRelease(key, holds.owner, position, "k2")])
        record = store.get(key) or {}
        assert (record["position"], record["applied_key"]) == (4, "k1")
        assert record["applied_at"] == documents.bson_time(released_at)
        assert record["lastUpdatedTime"] == documents.epoch_ms(later)


def test_a_take_of_a_held_entity_changes_nothing_of_it(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: entity_take(("a",), (1,))}, now)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    later = now + store.lease + timedelta(seconds=1)
    holds = store.take_entities({key: entity_take(("b",), (2,))}, later)  # "a" is the orphan
    assert holds.held(key)
    before = store.get(key)
    again = store.take_entities({key: entity_take(("c",), (3,))}, later + timedelta(seconds=5))
    assert not again.held(key)
    after = store.get(key) or {}
    assert after == before and after["orphan"] == {"keys": ["a"], "positions": [1]}
    assert not any(name.startswith("__") for name in after)


def test_a_hold_is_over_at_its_last_instant_and_not_before(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: entity_take()}, now)
    store_clock.advance(almost(store_clock, store.lease))  # the hold's last instant: it holds
    assert not store.take_entities({key: entity_take(("k2",), (2,))}, now).held(key)
    store_clock.advance(2)
    assert store.take_entities({key: entity_take(("k2",), (2,))}, now).held(key)


def test_a_holder_without_an_owner_holds_nothing_and_leaves_no_orphan(
        store: EventStore, now: datetime) -> None:
    key = fresh_entity()
    put_raw(store, {"idempotency_key": key, "record_type": "entity", "entity": ENTITY,
                    "holder": {"until": now + timedelta(hours=1), "keys": ["lost"],
                               "positions": [1]}, "orphan": None})
    holds = store.take_entities({key: entity_take(("k2",), (2,))}, now)
    assert holds.held(key)
    assert (store.get(key) or {}).get("orphan") is None


def test_a_claims_hold_runs_on_the_stores_clock_and_its_positions_become_the_orphan(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    store_clock.advance(600)  # the store's clock is ahead of the caller's
    key, event = fresh_entity(), new_key()
    batch = store.claim_many({event: FIELDS}, now, {key: entity_take((event,), (5,), "number")})
    assert batch.holds is not None and batch.holds.held(key)
    record = store.get(key) or {}
    ahead = now + timedelta(seconds=600)
    assert near(store_clock, record["holder"]["until"], ahead + store.lease)
    assert near(store_clock, stamped(record), ahead)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    holds = store.take_entities({key: entity_take(("k9",), (9,))}, now)
    assert holds.held(key)
    assert (store.get(key) or {})["orphan"] == {"keys": [event], "positions": [5]}


def test_a_claim_holds_an_entity_released_without_a_position(
        store: EventStore, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: entity_take()}, now)
    store.finish_many([], now, [EntityRelease(key, first.owner)])  # its event failed
    assert "position" not in (store.get(key) or {})
    event = new_key()
    batch = store.claim_many({event: FIELDS}, now, {key: entity_take((event,), (3,), "number")})
    assert batch.holds is not None and batch.holds.held(key)


def test_a_release_with_no_orphan_keys_left_leaves_no_orphan(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = fresh_entity()
    store.take_entities({key: entity_take(("a",), (1,))}, now)
    store_clock.advance((store.lease + timedelta(seconds=1)).total_seconds())
    holds = store.take_entities({key: entity_take(("b",), (2,))}, now)
    store.finish_many([], now, [EntityRelease(key, holds.owner, 2, "b",
                                              {"keys": [], "positions": []}, "number")])
    record = store.get(key) or {}
    assert record.get("orphan") is None and record["position"] == 2
    event = new_key()  # nothing left to read: the claim's cheap hold holds it again
    batch = store.claim_many({event: FIELDS}, now, {key: entity_take((event,), (3,), "number")})
    assert batch.holds is not None and batch.holds.held(key)


def test_an_untagged_release_moves_a_tagged_position_as_the_python_rule_does(
        store: EventStore, now: datetime) -> None:
    key = fresh_entity()
    first = store.take_entities({key: entity_take()}, now)
    store.finish_many([], now, [EntityRelease(key, first.owner, 1, "k1", None, "number")])
    expected = copy.deepcopy(store.get(key) or {})
    holds = store.take_entities({key: entity_take(("k2",), (2,))}, now)
    store.finish_many([], now, [EntityRelease(key, holds.owner, 2, "k2")])
    documents.released(expected, now, 2, "k2")
    record = store.get(key) or {}
    assert (record["position"], record["applied_key"], record["position_kind"]) == (
        expected["position"], expected["applied_key"], expected["position_kind"])
