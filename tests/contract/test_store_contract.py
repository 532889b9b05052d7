"""The storage contract: every test here runs on ``MemoryEventStore`` and ``MongoEventStore``.

Only the protocol's primitives are used (``eventbus.store.base.EventStore``),
except ``put_raw``, which writes a record around them as another tool would.
What is specific to MongoDB (indexes, round trips, the driver's errors) is
in ``test_mongo_only.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from eventbus.model.context import Child
from eventbus.model.delivery import Delivery
from eventbus.model.errors import AlreadyExists, Conflict, LeaseHeld
from eventbus.model.event import Event
from eventbus.model.keys import child_key, fingerprint
from eventbus.store import documents
from eventbus.store.base import Claim, EventStore, OutboxEntry
from eventbus.store.documents import FAILED, PENDING, PROCESSING, PUBLISHED, SUCCESS
from tests.contract.conftest import (
    DELIVERY,
    ERROR,
    EVENT,
    FIELDS,
    LEASE,
    RETENTION,
    SERVICE,
    SLACK,
    StoreClock,
    almost,
    exact,
    near,
    new_key,
    put_raw,
    without_id,
)
from tests.hypothesis_profiles import examples

GUARD_LEASE = timedelta(seconds=30)


def assert_unchanged(store: EventStore, key: str, before: dict[str, Any] | None) -> None:
    assert without_id(store.get(key)) == without_id(before)


def is_epoch_ms(value: Any) -> bool:
    return isinstance(value, str) and value.isdigit()


class TestProtocol:
    def test_every_primitive_of_the_protocol_is_implemented_with_its_signature(
            self, store: EventStore) -> None:
        members = {name for protocol in EventStore.__mro__ if protocol is not object
                   for name in vars(protocol) if not name.startswith("_")}  # every user's
        assert {"claim", "succeed", "fail", "reject", "get", "pending_outbox", "mark_published",
                "mark_publish_failed", "guard_take", "guard_finish", "guard_get", "summaries",
                "get_many", "reset", "ensure_indexes", "lease", "database"} <= set(members)
        for name in members:
            declared = getattr(EventStore, name)
            assert hasattr(store, name), name
            if callable(declared):
                wanted = list(inspect.signature(declared).parameters)[1:]  # without self
                assert list(inspect.signature(getattr(store, name)).parameters) == wanted, name

    def test_lease_is_the_configured_one_and_ensure_indexes_is_idempotent(
            self, store: EventStore) -> None:
        assert store.lease == LEASE
        store.ensure_indexes()
        store.ensure_indexes()


class TestClaim:
    def test_new_record_gets_attempt_one_and_every_seed_field(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert claim.attempt == 1
        assert len(claim.owner) == 32 and int(claim.owner, 16) >= 0
        record = store.get(key)
        assert record is not None
        assert without_id(claim.record) == without_id(record)  # as the claim left it
        # The lease ends a lease after the store's now (the server's, on MongoDB).
        assert near(store_clock, record["lease_until"], now + LEASE)
        stamp = documents.epoch_ms(now)
        assert without_id({**record, "lease_until": now + LEASE}) == {
            "idempotency_key": key, "event_type": "OR_MGMT", "event_version": "v2",
            "event_direction": "IN", "event_status": PROCESSING,
            "event_day_id": documents.event_day_id(now),
            "entity_metadata": {"partnerId": "p-1", "partnerName": "Acme",
                                "entity_id": "order-1", "entity_type": "Order",
                                "resilienceAttemptCount": {"1": stamp}},
            "entity_data": EVENT.entity_data, "pubsub": DELIVERY.pubsub_document(),
            "created": stamp, "lastUpdatedTime": stamp, "createdBy": SERVICE,
            "expire_at": now + RETENTION, "attempts": 1,
            "lease_until": now + LEASE, "lease_owner": claim.owner,
            "payload_fingerprint": fingerprint(EVENT),
        }
        assert isinstance(record["event_day_id"], int) and isinstance(record["created"], str)
        assert record["expire_at"].utcoffset() == timedelta(0)
        assert record["lease_until"].utcoffset() == timedelta(0)

    def test_times_are_epoch_millisecond_strings_and_bson_dates(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        moment = now + timedelta(microseconds=999)  # the stored grain is the millisecond
        claim = store.claim(key, FIELDS, moment)
        record = store.get(key)
        assert record is not None
        assert record["created"] == record["lastUpdatedTime"] == documents.epoch_ms(now)
        assert all(is_epoch_ms(stamp) for stamp
                   in record["entity_metadata"]["resilienceAttemptCount"].values())
        assert near(store_clock, record["lease_until"], now + LEASE)
        assert record["lease_until"].microsecond % 1000 == 0
        assert store.fail(key, claim.owner, moment + timedelta(seconds=1), ERROR, retryable=True)
        failed = store.get(key)
        assert failed is not None
        assert failed["lastUpdatedTime"] == documents.epoch_ms(now + timedelta(seconds=1))
        assert failed["created"] == documents.epoch_ms(now)

    def test_seed_fields_and_cascade_links_are_stored(self, store: EventStore,
                                                      now: datetime) -> None:
        key = new_key()
        fields = documents.event_fields(EVENT, DELIVERY, parent_key="p", root_key="r")
        store.claim(key, fields, now)
        record = store.get(key)
        assert record is not None
        assert (record["parent_key"], record["root_key"]) == ("p", "r")
        assert record["entity_data"] == {"orderId": 59734, "status": "$OR_PLC",
                                         "lines": [{"sku": "a"}]}

    def test_the_audit_fields_cannot_be_forged_by_the_fields(self, store: EventStore,
                                                             now: datetime) -> None:
        key = new_key()
        forged = {**FIELDS, "created": "1", "createdBy": "someone", "event_day_id": -1,
                  "entity_metadata": {**FIELDS["entity_metadata"],
                                      "resilienceAttemptCount": {"7": "1"}}}
        store.claim(key, forged, now)
        record = store.get(key)
        assert record is not None
        assert (record["created"], record["createdBy"], record["event_day_id"]) == (
            documents.epoch_ms(now), SERVICE, documents.event_day_id(now))
        assert record["entity_metadata"]["resilienceAttemptCount"] == {
            "1": documents.epoch_ms(now)}

    def test_live_lease_raises_already_exists_with_the_record(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        before = store.get(key)
        store_clock.advance(almost(store_clock, LEASE) - 0.001)
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE - timedelta(milliseconds=1))
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_a_lease_ending_now_is_still_held(self, store: EventStore, store_clock: StoreClock,
                                              now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        store_clock.advance(almost(store_clock, LEASE) + 0.000999)  # the same millisecond
        with pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, now + LEASE + timedelta(microseconds=999))

    def test_expired_lease_is_taken_as_attempt_two(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        first = store.claim(key, FIELDS, now)
        later = now + LEASE + timedelta(milliseconds=1)
        store_clock.advance((LEASE + timedelta(milliseconds=1)).total_seconds())
        redelivery = {**FIELDS, "pubsub": {**FIELDS["pubsub"], "deliveryAttempt": 2}}
        second = store.claim(key, redelivery, later)
        assert second.attempt == 2 and second.owner != first.owner
        assert second.record["lease_owner"] == second.owner  # the record as the claim left it
        record = store.get(key)
        assert record is not None and without_id(second.record) == without_id(record)
        assert record["entity_metadata"]["resilienceAttemptCount"] == {
            "1": documents.epoch_ms(now), "2": documents.epoch_ms(later)}
        assert record["attempts"] == 2 and near(store_clock, record["lease_until"], later + LEASE)
        assert record["pubsub"]["deliveryAttempt"] == 2
        assert record["created"] == documents.epoch_ms(now)
        assert record["lastUpdatedTime"] == documents.epoch_ms(later)
        assert not store.succeed(key, first.owner, later)

    def test_failed_retryable_is_taken_and_loses_its_error(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        first = store.claim(key, FIELDS, now)
        assert store.fail(key, first.owner, now, ERROR, retryable=True)
        store_clock.advance(1)
        second = store.claim(key, FIELDS, now + timedelta(seconds=1))
        assert second.attempt == 2
        assert second.record["attempts"] == 2 and "error" not in second.record
        record = store.get(key)
        assert record is not None and without_id(record) == without_id(second.record)
        assert record["event_status"] == PROCESSING
        assert "error" not in record and "retryable" not in record

    def test_the_attempt_map_keeps_every_attempt(self, store: EventStore,
                                                 now: datetime) -> None:
        key = new_key()
        moments = [now + timedelta(seconds=n) for n in range(4)]
        for moment in moments:
            claim = store.claim(key, FIELDS, moment)
            assert store.fail(key, claim.owner, moment, ERROR, retryable=True)
        record = store.get(key)
        assert record is not None and record["attempts"] == 4
        assert record["entity_metadata"]["resilienceAttemptCount"] == {
            str(number): documents.epoch_ms(moment) for number, moment in enumerate(moments, 1)}

    def test_failed_for_good_is_not_taken(self, store: EventStore, store_clock: StoreClock,
                                          now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.fail(key, claim.owner, now, ERROR, retryable=False)
        before = store.get(key)
        store_clock.advance((LEASE * 2).total_seconds())
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE * 2)
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_success_is_not_taken_and_stays_unchanged(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        before = store.get(key)
        assert before is not None and before["event_status"] == SUCCESS
        store_clock.advance((LEASE * 2).total_seconds())
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE * 2)
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_pending_record_written_elsewhere_is_taken(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        put_raw(store, {"idempotency_key": key, "event_status": PENDING,
                        "created": "1", "entity_metadata": {"partnerId": "x"}})
        claim = store.claim(key, FIELDS, now)
        record = store.get(key)
        assert claim.attempt == 1 and record is not None
        assert without_id(claim.record) == without_id(record)
        assert claim.record["event_status"] == PROCESSING
        assert record["created"] == "1"  # insert fields belong to new records only
        assert record["entity_metadata"] == {
            "partnerId": "x", "resilienceAttemptCount": {"1": documents.epoch_ms(now)}}

    def test_a_record_without_a_status_is_taken_as_new(
            self, store: EventStore, now: datetime) -> None:
        # A document with no event_status holds no event yet: the claim writes
        # the seed and audit fields as for a new record, and starts the attempt
        # map afresh, keeping only the attempt count.
        key = new_key()
        put_raw(store, {"idempotency_key": key, "created": "1", "attempts": 2, "note": "kept",
                        "entity_metadata": {"partnerId": "x",
                                            "resilienceAttemptCount": {"1": "1"}}})
        claim = store.claim(key, FIELDS, now)
        record = store.get(key)
        assert claim.attempt == 3 and record is not None
        assert record["created"] == documents.epoch_ms(now)
        assert record["createdBy"] == SERVICE and record["event_type"] == "OR_MGMT"
        assert record["entity_metadata"] == {
            **FIELDS["entity_metadata"], "resilienceAttemptCount": {"3": documents.epoch_ms(now)}}
        assert record["note"] == "kept"

    def test_a_record_without_entity_metadata_gets_the_attempt_map(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        put_raw(store, {"idempotency_key": key, "event_status": FAILED, "retryable": True})
        store.claim(key, FIELDS, now)
        record = store.get(key)
        assert record is not None
        assert record["entity_metadata"] == {
            "resilienceAttemptCount": {"1": documents.epoch_ms(now)}}

    def test_a_claim_returns_copies(self, store: EventStore, now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        record = store.get(key)
        assert record is not None
        record["event_status"] = "CHANGED"
        record["entity_metadata"]["partnerId"] = "changed"
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now)
        raised.value.record["entity_metadata"]["partnerId"] = "changed again"  # type: ignore[index]
        stored = store.get(key)
        assert stored is not None
        assert stored["event_status"] == PROCESSING
        assert stored["entity_metadata"]["partnerId"] == "p-1"


class TestFinish:
    def test_succeed_stores_children_and_drops_the_lease(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        children = [{"idempotency_key": f"{key}/0:Sub", "status": "PENDING"}]
        assert store.succeed(key, claim.owner, now + timedelta(seconds=2), children)
        record = store.get(key)
        assert record is not None
        assert record["event_status"] == SUCCESS and record["outbox"] == children
        assert record["lastUpdatedTime"] == documents.epoch_ms(now + timedelta(seconds=2))
        assert "lease_until" not in record and "lease_owner" not in record
        assert record["attempts"] == 1

    def test_succeed_without_children_has_no_outbox(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        record = store.get(key)
        assert record is not None and "outbox" not in record

    def test_fail_records_error_and_retryable(self, store: EventStore,
                                              now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.fail(key, claim.owner, now, ERROR, retryable=False)
        record = store.get(key)
        assert record is not None
        assert (record["event_status"], record["retryable"], record["error"]) == (
            FAILED, False, ERROR)
        assert "lease_until" not in record and "lease_owner" not in record

    @pytest.mark.parametrize("finish", ["succeed", "fail"])
    def test_a_stale_owner_changes_nothing(self, store: EventStore, now: datetime,
                                           finish: str) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        before = store.get(key)
        if finish == "succeed":
            assert store.succeed(key, "stale", now, [{"idempotency_key": "c"}]) is False
        else:
            assert store.fail(key, "stale", now, ERROR, retryable=True) is False
        assert_unchanged(store, key, before)

    @pytest.mark.parametrize("finish", ["succeed", "fail"])
    def test_the_owner_whose_lease_was_taken_over_changes_nothing(
            self, store: EventStore, store_clock: StoreClock, now: datetime,
            finish: str) -> None:
        key = new_key()
        first = store.claim(key, FIELDS, now)
        store_clock.advance((LEASE * 2).total_seconds())
        second = store.claim(key, FIELDS, now + LEASE * 2)
        before = store.get(key)
        if finish == "succeed":
            assert not store.succeed(key, first.owner, now + LEASE * 2)
        else:
            assert not store.fail(key, first.owner, now + LEASE * 2, ERROR, retryable=True)
        assert_unchanged(store, key, before)
        assert store.succeed(key, second.owner, now + LEASE * 2)

    @pytest.mark.parametrize("finish", ["succeed", "fail", "renew"])
    def test_an_expired_lease_nobody_took_is_lost(
            self, store: EventStore, store_clock: StoreClock, now: datetime,
            finish: str) -> None:
        # Fenced: a frozen worker whose lease ran out writes nothing, even if
        # nobody took the event meanwhile; the event is claimed again.
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        store_clock.advance((LEASE + timedelta(milliseconds=1)).total_seconds())
        before = store.get(key)
        if finish == "succeed":
            assert not store.succeed(key, claim.owner, now)
        elif finish == "fail":
            assert not store.fail(key, claim.owner, now, ERROR, retryable=True)
        else:
            assert not store.renew(key, claim.owner, now)
        assert_unchanged(store, key, before)
        assert store.claim(key, FIELDS, now + LEASE * 3).attempt == 2

    def test_finishing_twice_is_refused(self, store: EventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        before = store.get(key)
        assert not store.fail(key, claim.owner, now, ERROR, retryable=True)
        assert not store.succeed(key, claim.owner, now, [{"idempotency_key": "c"}])
        assert_unchanged(store, key, before)

    def test_finishing_an_unknown_key_is_refused(self, store: EventStore,
                                                 now: datetime) -> None:
        key = new_key()
        assert not store.succeed(key, "owner", now)
        assert not store.fail(key, "owner", now, ERROR, retryable=True)
        assert store.get(key) is None
        assert store.summaries() == []

    def test_finishing_a_rejected_record_is_refused(self, store: EventStore,
                                                    now: datetime) -> None:
        key = new_key()
        assert store.reject(key, FIELDS, now, ERROR)
        before = store.get(key)
        assert not store.succeed(key, "", now)
        assert_unchanged(store, key, before)


class TestReject:
    def test_reject_twice_stores_one_record(self, store: EventStore,
                                            now: datetime) -> None:
        key = f"invalid:{uuid.uuid4().hex}"
        fields = documents.refused_fields(Delivery(data=b"{bad", attributes={},
                                                   message_id="m-9"), None)
        fields.pop("raw_payload")
        error = {"type": "InvalidEvent", "message": "not JSON", "classification": "invalid"}
        assert store.reject(key, fields, now, error, raw_payload="{bad") is True
        before = store.get(key)
        assert before is not None and before["delivery_count"] == 1
        # The same bytes again: one record, which counts the delivery and nothing else.
        assert store.reject(key, fields, now + timedelta(seconds=1), ERROR, "other") is False
        assert store.reject(key, fields, now + timedelta(seconds=2), ERROR, "other") is False
        assert_unchanged(store, key, {**before, "delivery_count": 3})
        assert [doc["idempotency_key"] for doc in store.summaries()] == [key]
        assert (before["event_status"], before["retryable"], before["error"]) == (
            FAILED, False, error)
        assert before["raw_payload"] == "{bad" and before["event_type"] == "UNKNOWN"
        assert before["attempts"] == 0 and before["createdBy"] == SERVICE
        assert before["entity_metadata"]["resilienceAttemptCount"] == {}
        assert before["created"] == before["lastUpdatedTime"] == documents.epoch_ms(now)
        assert isinstance(before["expire_at"], datetime)
        assert before["expire_at"] == now + RETENTION
        assert "lease_owner" not in before and "lease_until" not in before

    def test_reject_counts_only_the_same_bytes_on_a_record_still_rejected(
            self, store: EventStore, now: datetime) -> None:
        def refused(data: bytes) -> dict[str, Any]:
            return documents.refused_fields(Delivery(data=data, attributes={}), None)

        error = {"type": "InvalidEvent", "message": "not JSON", "classification": "invalid"}
        key = f"invalid:{uuid.uuid4().hex}"
        assert store.reject(key, refused(b"{bad"), now, error)
        before = store.get(key)
        # Other bytes under the key (never so by rejected_key's hash): unchanged, uncounted.
        assert store.reject(key, refused(b"{other"), now, error) is False
        assert_unchanged(store, key, before)
        # A record that is no rejection (a claimed event) is never changed by a rejection.
        claimed = new_key()
        store.claim(claimed, {**FIELDS, "payload_sha256": "a" * 64}, now)
        taken = store.get(claimed)
        assert store.reject(claimed, {**FIELDS, "payload_sha256": "a" * 64}, now, error) is False
        assert_unchanged(store, claimed, taken)
        # Without a payload hash there is nothing to recognise: inserted once, never counted.
        bare = new_key()
        assert store.reject(bare, FIELDS, now, ERROR)
        first = store.get(bare)
        assert first is not None and first["delivery_count"] == 1
        assert store.reject(bare, FIELDS, now, ERROR) is False
        assert_unchanged(store, bare, first)

    def test_reject_without_a_raw_payload_stores_none(self, store: EventStore,
                                                      now: datetime) -> None:
        key = new_key()
        assert store.reject(key, FIELDS, now, ERROR)
        record = store.get(key)
        assert record is not None and "raw_payload" not in record

    @pytest.mark.parametrize("state", ["processing", "success", "failed retryable",
                                       "failed for good"])
    def test_reject_never_changes_an_existing_record(self, store: EventStore,
                                                     now: datetime, state: str) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        if state == "success":
            store.succeed(key, claim.owner, now, [{"idempotency_key": "c"}])
        elif state.startswith("failed"):
            store.fail(key, claim.owner, now, ERROR, retryable=state == "failed retryable")
        before = store.get(key)
        assert store.reject(key, FIELDS, now, ERROR, raw_payload="x") is False
        assert_unchanged(store, key, before)

    def test_rejected_record_is_not_claimable(self, store: EventStore,
                                              now: datetime) -> None:
        key = new_key()
        store.reject(key, FIELDS, now, ERROR)
        before = store.get(key)
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now)
        assert raised.value.record == before


class TestCorrectedAfterRejection:
    """A refused event's record never swallows the corrected event published under its key."""

    @staticmethod
    def refused(store: EventStore, now: datetime) -> tuple[str, dict[str, Any]]:
        key = new_key()
        bad = dataclasses.replace(EVENT, event_type="OR_MGTM")
        delivery = Delivery(data=b'{"event_type": "OR_MGTM"}', attributes={}, message_id="m-1")
        fields = {**documents.refused_fields(delivery, bad),
                  "payload_fingerprint": fingerprint(bad)}
        error = {"type": "UnknownEventType", "message": "no handler for OR_MGTM",
                 "classification": "invalid"}
        assert store.reject(key, fields, now, error)
        return key, fields

    def test_a_different_payload_takes_the_rejected_record(self, store: EventStore,
                                                           now: datetime) -> None:
        key, refused = self.refused(store, now)
        claim = store.claim(key, FIELDS, now + timedelta(seconds=5))
        assert claim.attempt == 1 and claim.record["lease_owner"] == claim.owner
        assert store.succeed(key, claim.owner, now + timedelta(seconds=6))
        record = store.get(key) or {}
        assert (record["event_status"], record["event_type"]) == (SUCCESS, "OR_MGMT")
        assert record["entity_data"] == EVENT.entity_data
        assert record["payload_fingerprint"] == FIELDS["payload_fingerprint"]
        assert record["created"] == documents.epoch_ms(now)  # the record's own history
        assert not {"rejected", "raw_payload", "payload_sha256", "error"} & record.keys()
        [kept] = record["rejections"]
        assert kept["event_type"] == "OR_MGTM" and kept["error"]["type"] == "UnknownEventType"
        assert kept["payload_fingerprint"] == refused["payload_fingerprint"]
        assert kept["raw_payload"] == refused["raw_payload"]
        assert list(record["entity_metadata"]["resilienceAttemptCount"]) == ["1"]

    def test_the_same_payload_stays_a_duplicate(self, store: EventStore,
                                                now: datetime) -> None:
        key, refused = self.refused(store, now)
        before = store.get(key)
        same = {**FIELDS, "payload_fingerprint": refused["payload_fingerprint"]}
        with pytest.raises(AlreadyExists):
            store.claim(key, same, now)
        assert_unchanged(store, key, before)

    def test_a_processed_record_still_conflicts(self, store: EventStore,
                                                now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        store.fail(key, claim.owner, now, ERROR, retryable=False)
        with pytest.raises(Conflict):
            store.claim(key, {**FIELDS, "payload_fingerprint": "other"}, now)


def _race(workers: int, call: Callable[[], Any]) -> list[Any]:
    """Run ``call`` on ``workers`` threads released at once; return results and exceptions."""
    barrier = threading.Barrier(workers)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        try:
            result: Any = call()
        except BaseException as exc:  # collected and asserted by the caller
            result = exc
        with lock:
            results.append(result)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class TestConcurrency:
    @pytest.mark.parametrize("state", ["new", "expired lease", "failed retryable"])
    def test_sixteen_claims_of_one_key_make_one_winner(
            self, store: EventStore, store_clock: StoreClock, now: datetime,
            state: str) -> None:
        key = new_key()
        if state != "new":
            first = store.claim(key, FIELDS, now - LEASE * 2)
            if state == "failed retryable":
                assert store.fail(key, first.owner, now - LEASE * 2, ERROR, retryable=True)
            store_clock.advance((LEASE * 2).total_seconds())
        results = _race(16, lambda: store.claim(key, FIELDS, now))
        claims = [result for result in results if isinstance(result, Claim)]
        others = [result for result in results if not isinstance(result, Claim)]
        assert len(claims) == 1, results
        assert claims[0].attempt == (1 if state == "new" else 2)
        assert len(others) == 15 and all(isinstance(exc, AlreadyExists) for exc in others), others
        assert [doc["idempotency_key"] for doc in store.summaries()] == [key]
        record = store.get(key)
        assert record is not None and record["lease_owner"] == claims[0].owner

    def test_sixteen_guard_takes_of_one_effect_make_one_owner(
            self, store: EventStore, now: datetime) -> None:
        key = f"effect:{uuid.uuid4().hex}"
        owners = iter(range(16))
        lock = threading.Lock()

        def take() -> str:
            with lock:
                owner = f"owner-{next(owners)}"
            assert store.guard_take(key, owner, now, GUARD_LEASE) is None
            return owner

        results = _race(16, take)
        taken = [result for result in results if isinstance(result, str)]
        assert len(taken) == 1, results
        assert all(isinstance(result, LeaseHeld) for result in results if result not in taken)
        record = store.guard_get(key)
        assert record is not None and record["lease_owner"] == taken[0]
        assert record["attempts"] == 1

    def test_eight_relays_mark_one_entry_published_once(
            self, store: EventStore, now: datetime) -> None:
        parent = new_key()
        succeed_with_outbox(store, parent, now, [entry(parent, 0, now)])
        (pending,) = store.pending_outbox(now)
        results = _race(8, lambda: store.mark_published(pending, now, "m-1", 1))
        assert sorted(results) == [False] * 7 + [True]
        record = store.get(parent)
        assert record is not None and record["outbox"][0]["publish_attempts"] == 1


# --- the outbox ----------------------------------------------------------------------------

def entry(parent: str, index: int, created_at: datetime, child_type: str = "Sub",
          root: str = "") -> dict[str, Any]:
    """An outbox entry as the processor stores it (``Child.to_document``)."""
    child = Child(key=child_key(parent, child_type, index),
                  event=Event(child_type, "v1", "IN", EVENT.entity_metadata, {"n": index}))
    return child.to_document(parent, root or parent, created_at)


def succeed_with_outbox(store: EventStore, key: str, now: datetime,
                        outbox: list[dict[str, Any]]) -> None:
    claim = store.claim(key, FIELDS, now)
    assert store.succeed(key, claim.owner, now, outbox)


def pending(store: EventStore, cutoff: datetime) -> set[tuple[str, int, str]]:
    return {(item.parent_key, item.index, item.key) for item in store.pending_outbox(cutoff)}


class TestOutbox:
    def test_succeed_stores_the_outbox_as_given(self, store: EventStore,
                                                now: datetime) -> None:
        key = new_key()
        outbox = [entry(key, 0, now), entry(key, 1, now, "Other")]
        succeed_with_outbox(store, key, now, outbox)
        record = store.get(key)
        assert record is not None and record["outbox"] == outbox
        assert record["outbox"][0]["status"] == PENDING
        assert record["outbox"][0]["publish_attempts"] == 0

    def test_outbox_times_are_stored_as_bson_dates(self, store: EventStore,
                                                   now: datetime) -> None:
        # The server keeps milliseconds, in UTC; the memory store must return the same.
        key = new_key()
        plus_two = timezone(timedelta(hours=2))
        given = (now + timedelta(microseconds=1234)).astimezone(plus_two)
        succeed_with_outbox(store, key, now, [entry(key, 0, given)])
        record = store.get(key)
        assert record is not None
        stored = record["outbox"][0]["created_at"]
        assert stored == now + timedelta(milliseconds=1)
        assert stored.microsecond % 1000 == 0 and stored.utcoffset() == timedelta(0)
        (item,) = store.pending_outbox(now + timedelta(seconds=1))
        assert item.entry["created_at"] == stored

    def test_pending_outbox_respects_created_at_and_status(
            self, store: EventStore, now: datetime) -> None:
        young, old = now, now - timedelta(seconds=10)
        first, second, third = new_key(), new_key(), new_key()
        succeed_with_outbox(store, first, now, [entry(first, 0, old), entry(first, 1, young)])
        succeed_with_outbox(store, second, now, [entry(second, 0, old)])
        succeed_with_outbox(store, third, now, [])
        store.claim(new_key(), FIELDS, now)  # PROCESSING, no outbox
        both_old = {(first, 0, f"{first}/0:Sub"), (second, 0, f"{second}/0:Sub")}
        assert pending(store, now - timedelta(seconds=5)) == both_old
        assert pending(store, old) == both_old  # the cutoff itself is included
        assert pending(store, old - timedelta(milliseconds=1)) == set()
        assert pending(store, young) == both_old | {(first, 1, f"{first}/1:Sub")}
        (published,) = [item for item in store.pending_outbox(old) if item.parent_key == second]
        assert store.mark_published(published, now, "m-1", 1)
        assert pending(store, young) == {(first, 0, f"{first}/0:Sub"),
                                         (first, 1, f"{first}/1:Sub")}

    def test_pending_entries_carry_the_stored_entry(self, store: EventStore,
                                                    now: datetime) -> None:
        key = new_key()
        stored = entry(key, 0, now, root="root-1")
        succeed_with_outbox(store, key, now, [stored])
        (item,) = store.pending_outbox(now)
        assert isinstance(item, OutboxEntry)
        assert (item.parent_key, item.index, item.key) == (key, 0, stored["idempotency_key"])
        assert dict(item.entry) == stored

    def test_mark_published_only_once(self, store: EventStore, now: datetime) -> None:
        key = new_key()
        succeed_with_outbox(store, key, now, [entry(key, 0, now), entry(key, 1, now)])
        first, second = sorted(store.pending_outbox(now), key=lambda item: item.index)
        later = now + timedelta(seconds=3)
        assert store.mark_published(second, later, "m-2", 2) is True
        assert store.mark_published(second, later + timedelta(seconds=1), "m-3", 1) is False
        record = store.get(key)
        assert record is not None
        published = record["outbox"][1]
        assert (published["status"], published["published_at"], published["messageId"],
                published["publish_attempts"]) == (PUBLISHED, later, "m-2", 2)
        assert record["outbox"][0] == first.entry  # the other entry is untouched
        assert record["event_status"] == SUCCESS
        assert pending(store, later) == {(key, 0, first.key)}

    def test_mark_publish_failed_keeps_pending_and_counts_tries(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        succeed_with_outbox(store, key, now, [entry(key, 0, now)])
        (item,) = store.pending_outbox(now)
        down = {"type": "PublishError", "message": "down", "classification": "transient"}
        store.mark_publish_failed(item, now + timedelta(seconds=1), down, 2)
        store.mark_publish_failed(item, now + timedelta(seconds=2), down, 3)
        record = store.get(key)
        assert record is not None
        failed = record["outbox"][0]
        assert failed["status"] == PENDING and failed["publish_attempts"] == 5
        assert failed["last_error"] == down
        assert failed["last_attempt_at"] == now + timedelta(seconds=2)
        assert pending(store, now) == {(key, 0, item.key)}
        assert store.mark_published(item, now + timedelta(seconds=3), "m-1", 1)
        record = store.get(key)
        assert record is not None
        done = record["outbox"][0]
        assert done["status"] == PUBLISHED and done["publish_attempts"] == 6
        assert "last_error" not in done

    def test_mark_publish_failed_leaves_a_published_entry_alone(
            self, store: EventStore, now: datetime) -> None:
        key = new_key()
        succeed_with_outbox(store, key, now, [entry(key, 0, now)])
        (item,) = store.pending_outbox(now)
        assert store.mark_published(item, now, "m-1", 1)
        before = store.get(key)
        store.mark_publish_failed(item, now, ERROR, 4)
        assert_unchanged(store, key, before)

    @pytest.mark.parametrize("address", ["other key", "index out of range", "unknown parent"])
    def test_an_entry_is_addressed_by_parent_index_and_key(
            self, store: EventStore, now: datetime, address: str) -> None:
        key = new_key()
        succeed_with_outbox(store, key, now, [entry(key, 0, now)])
        (item,) = store.pending_outbox(now)
        wrong = {
            "other key": OutboxEntry(key, 0, {**item.entry, "idempotency_key": "other"}),
            "index out of range": OutboxEntry(key, 5, item.entry),
            "unknown parent": OutboxEntry(new_key(), 0, item.entry),
        }[address]
        before = store.get(key)
        assert store.mark_published(wrong, now, "m-1", 1) is False
        store.mark_publish_failed(wrong, now, ERROR, 1)
        assert_unchanged(store, key, before)


# --- the side-effect guard -------------------------------------------------------------------

def effect_key() -> str:
    return f"notify:{uuid.uuid4().hex}"


class TestGuard:
    def test_the_first_take_leases_a_new_record(self, store: EventStore,
                                                store_clock: StoreClock,
                                                now: datetime) -> None:
        key = effect_key()
        assert store.guard_get(key) is None
        assert store.guard_take(key, "a", now, GUARD_LEASE) is None
        record = store.guard_get(key)
        assert record is not None
        assert near(store_clock, record["lease_until"], now + GUARD_LEASE)
        assert {**record, "lease_until": now + GUARD_LEASE} == {
            "_id": key, "status": PROCESSING, "lease_owner": "a",
            "lease_until": now + GUARD_LEASE, "attempts": 1, "created_at": now,
            "updated_at": now}

    def test_a_live_lease_raises_lease_held_with_the_record(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        before = store.guard_get(key)
        for moment in (now, now + GUARD_LEASE):  # the lease's last millisecond still holds
            if moment != now:
                store_clock.advance(almost(store_clock, GUARD_LEASE))
            with pytest.raises(LeaseHeld) as raised:
                store.guard_take(key, "b", moment, GUARD_LEASE)
            assert raised.value.record == {**(before or {}), "idempotency_key": key}
        assert store.guard_get(key) == before

    def test_an_expired_lease_is_taken_by_the_next_owner(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        later = now + GUARD_LEASE + timedelta(milliseconds=1)
        store_clock.advance((GUARD_LEASE + timedelta(milliseconds=1)).total_seconds())
        assert store.guard_take(key, "b", later, GUARD_LEASE) is None
        record = store.guard_get(key)
        assert record is not None
        assert near(store_clock, record["lease_until"], later + GUARD_LEASE)
        assert (record["lease_owner"], record["attempts"],
                record["updated_at"], record["created_at"]) == ("b", 2, later, now)

    def test_success_is_returned_as_the_record_afterwards(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        done_at = now + timedelta(seconds=1)
        result = {"status_code": 200, "url": "http://partner/p-1"}
        assert store.guard_finish(key, "a", done_at, succeeded=True, result=result)
        record = store.guard_get(key)
        assert record is not None
        assert (record["status"], record["result"], record["done_at"], record["updated_at"]) \
            == (SUCCESS, result, done_at, done_at)
        assert "lease_owner" not in record and "lease_until" not in record
        assert "error" not in record
        for moment in (done_at, now + GUARD_LEASE * 10):
            assert store.guard_take(key, "b", moment, GUARD_LEASE) == record
            store_clock.advance((GUARD_LEASE * 10).total_seconds())
        assert store.guard_get(key) == record

    def test_a_failure_is_stored_only_by_the_owner(self, store: EventStore,
                                                   now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        before = store.guard_get(key)
        assert store.guard_finish(key, "b", now, succeeded=False, result=ERROR) is False
        assert store.guard_get(key) == before
        assert store.guard_finish(key, "a", now, succeeded=False, result=ERROR) is True
        record = store.guard_get(key)
        assert record is not None
        assert (record["status"], record["error"]) == (FAILED, ERROR)
        assert "lease_owner" not in record and "lease_until" not in record
        assert "result" not in record and "done_at" not in record

    def test_a_failed_effect_may_be_taken_again_at_once(self, store: EventStore,
                                                        now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        store.guard_finish(key, "a", now, succeeded=False, result=ERROR)
        assert store.guard_take(key, "b", now, GUARD_LEASE) is None
        record = store.guard_get(key)
        assert record is not None
        assert (record["status"], record["lease_owner"], record["attempts"]) == (
            PROCESSING, "b", 2)
        assert store.guard_finish(key, "b", now, succeeded=True, result={"ok": True})
        record = store.guard_get(key)
        assert record is not None
        assert record["status"] == SUCCESS and "error" not in record

    def test_a_late_failure_cannot_undo_the_next_owners_lease(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        later = now + GUARD_LEASE * 2
        store_clock.advance((GUARD_LEASE * 2).total_seconds())
        store.guard_take(key, "b", later, GUARD_LEASE)
        before = store.guard_get(key)
        assert store.guard_finish(key, "a", later, succeeded=False, result=ERROR) is False
        assert store.guard_get(key) == before

    def test_a_success_is_stored_even_when_the_lease_was_lost(
            self, store: EventStore, store_clock: StoreClock, now: datetime) -> None:
        key = effect_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        later = now + GUARD_LEASE * 2
        store_clock.advance((GUARD_LEASE * 2).total_seconds())
        store.guard_take(key, "b", later, GUARD_LEASE)
        assert store.guard_finish(key, "a", later, succeeded=True, result={"status_code": 204})
        record = store.guard_get(key)
        assert record is not None
        assert (record["status"], record["result"]) == (SUCCESS, {"status_code": 204})
        assert "lease_owner" not in record and "lease_until" not in record
        assert store.guard_take(key, "c", later, GUARD_LEASE) == record
        # b's own failure afterwards cannot undo the success either.
        assert store.guard_finish(key, "b", later, succeeded=False, result=ERROR) is False
        assert store.guard_get(key) == record

    def test_finishing_an_unknown_effect_is_refused(self, store: EventStore,
                                                    now: datetime) -> None:
        key = effect_key()
        for succeeded in (True, False):
            assert store.guard_finish(key, "a", now, succeeded=succeeded, result={}) is False
        assert store.guard_get(key) is None

    def test_guard_records_are_not_events(self, store: EventStore, now: datetime) -> None:
        key = new_key()
        store.guard_take(key, "a", now, GUARD_LEASE)
        assert store.get(key) is None and store.summaries() == []
        store.claim(key, FIELDS, now)  # the same key as an event is a different record
        record = store.guard_get(key)
        assert record is not None and record["lease_owner"] == "a"


# --- operator queries ------------------------------------------------------------------------

def _claimed(store: EventStore, key: str, now: datetime, root: str = "",
             parent: str = "") -> Claim:
    fields = documents.event_fields(EVENT, DELIVERY, parent_key=parent, root_key=root)
    return store.claim(key, fields, now)


def cascade(store: EventStore, now: datetime) -> dict[str, str]:
    """Store a cascade root → child → grandchild, an unrelated root and a rejected event."""
    root = new_key()
    child = child_key(root, "Sub", 0)
    grandchild = child_key(child, "Notify", 0)
    other, rejected = new_key(), f"invalid:{uuid.uuid4().hex}"
    claim = _claimed(store, root, now)
    store.succeed(root, claim.owner, now, [entry(root, 0, now)])
    claim = _claimed(store, child, now, root=root, parent=root)
    store.succeed(child, claim.owner, now, [entry(child, 0, now, "Notify", root=root)])
    claim = _claimed(store, grandchild, now, root=root, parent=child)
    store.fail(grandchild, claim.owner, now, ERROR, retryable=True)
    claim = _claimed(store, other, now)
    store.succeed(other, claim.owner, now)
    store.reject(rejected, FIELDS, now, ERROR)
    return {"root": root, "child": child, "grandchild": grandchild, "other": other,
            "rejected": rejected}


def by_key(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {summary["idempotency_key"]: summary for summary in summaries}


class TestSummaries:
    def test_a_cascade_is_its_root_and_every_descendant(self, store: EventStore,
                                                        now: datetime) -> None:
        keys = cascade(store, now)
        root, child, grandchild = keys["root"], keys["child"], keys["grandchild"]
        found = store.summaries([root])
        assert len(found) == 3
        assert by_key(found) == {
            root: {"idempotency_key": root, "event_type": "OR_MGMT", "event_status": SUCCESS,
                   "outbox": [{"idempotency_key": child}]},
            child: {"idempotency_key": child, "event_type": "OR_MGMT",
                    "event_status": SUCCESS, "root_key": root,
                    "outbox": [{"idempotency_key": grandchild}]},
            grandchild: {"idempotency_key": grandchild, "event_type": "OR_MGMT",
                         "event_status": FAILED, "retryable": True, "error": ERROR,
                         "root_key": root},
        }

    def test_every_event_without_roots(self, store: EventStore, now: datetime) -> None:
        keys = cascade(store, now)
        found = by_key(store.summaries())
        assert set(found) == set(keys.values())
        assert found[keys["rejected"]] == {
            "idempotency_key": keys["rejected"], "event_type": "OR_MGMT",
            "event_status": FAILED, "retryable": False, "error": ERROR}
        assert found[keys["other"]] == {"idempotency_key": keys["other"],
                                        "event_type": "OR_MGMT", "event_status": SUCCESS}

    def test_several_roots_and_unknown_roots(self, store: EventStore, now: datetime) -> None:
        keys = cascade(store, now)
        found = store.summaries({keys["other"], keys["rejected"], "unknown"})
        assert set(by_key(found)) == {keys["other"], keys["rejected"]}
        assert store.summaries([]) == []
        assert store.summaries(["unknown"]) == []

    def test_a_child_as_root_finds_itself_only(self, store: EventStore, now: datetime) -> None:
        # Descendants are found by root_key, the key of the cascade's first event.
        keys = cascade(store, now)
        assert set(by_key(store.summaries([keys["child"]]))) == {keys["child"]}

    def test_summaries_hold_only_the_summary_fields(self, store: EventStore,
                                                    now: datetime) -> None:
        cascade(store, now)
        for summary in store.summaries():
            assert set(summary) <= set(documents.SUMMARY_FIELDS)
            for child in summary.get("outbox", []):
                assert set(child) == {"idempotency_key"}


class TestGetMany:
    def test_the_records_of_the_keys_that_exist(self, store: EventStore,
                                                now: datetime) -> None:
        keys = cascade(store, now)
        wanted = [keys["root"], "unknown", keys["rejected"]]
        found = store.get_many(wanted)
        assert len(found) == 2
        assert {record["idempotency_key"]: without_id(record) for record in found} == {
            key: without_id(store.get(key)) for key in (keys["root"], keys["rejected"])}
        assert store.get_many([]) == [] and store.get_many({"unknown"}) == []

    def test_records_are_whole(self, store: EventStore, now: datetime) -> None:
        keys = cascade(store, now)
        (record,) = store.get_many([keys["root"]])
        assert record["outbox"][0]["status"] == PENDING and "entity_data" in record


class TestReset:
    def test_reset_forgets_every_event_outbox_and_guard(self, store: EventStore,
                                                        now: datetime) -> None:
        keys = cascade(store, now)
        store.guard_take("effect", "a", now, GUARD_LEASE)
        store.reset()
        assert store.summaries() == [] and store.get(keys["root"]) is None
        assert list(store.pending_outbox(now + timedelta(days=1))) == []
        assert store.guard_get("effect") is None
        assert store.get_many(list(keys.values())) == []

    def test_the_store_works_after_a_reset(self, store: EventStore, now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        store.reset()
        assert store.claim(key, FIELDS, now).attempt == 1
        with pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, now)
        assert store.guard_take("effect", "a", now, GUARD_LEASE) is None


# --- the claim rule, in Python and in each store, on generated records ---------------------

MISSING = object()
_ms = st.integers(-3, 3) | st.integers(-10**7, 10**7)
before_images = st.fixed_dictionaries({
    "event_status": st.sampled_from([MISSING, None, "", PENDING, PROCESSING, SUCCESS, FAILED,
                                     "ARCHIVED"]),
    "retryable": st.sampled_from([MISSING, True, False, None, 1, 0, "true"]),
    "lease_until": st.just(MISSING) | st.none() | _ms.map(lambda ms: timedelta(milliseconds=ms)),
    "lease_owner": st.just(MISSING) | st.just("earlier"),
    # A deferral (RetryAfter): a FAILED-retryable record waits for it, whatever else it holds.
    documents.NOT_BEFORE: st.just(MISSING) | st.none() | st.just("soon") | _ms.map(
        lambda ms: timedelta(milliseconds=ms)),
    "attempts": st.just(MISSING) | st.none() | st.integers(0, 6),
    "entity_metadata": st.just(MISSING) | st.fixed_dictionaries(
        {"partnerId": st.just("old")},
        optional={"resilienceAttemptCount": st.dictionaries(
            st.sampled_from("12345"), st.just("0"), max_size=3)}),
    "error": st.just(MISSING) | st.just(ERROR),
    "created": st.just(MISSING) | st.just("1"),
    "outbox": st.just(MISSING) | st.just([{"idempotency_key": "c", "status": PENDING}]),
})


def _document(key: str, image: dict[str, Any], now: datetime) -> dict[str, Any]:
    document: dict[str, Any] = {"idempotency_key": key}
    for name, value in image.items():
        if value is not MISSING:
            document[name] = now + value if isinstance(value, timedelta) else value
    return document


def taken_image(before: dict[str, Any], moment: datetime, owner: str,
                lease_until: datetime) -> dict[str, Any]:
    """The record a claim stamped ``moment`` leaves, from ``before`` (the pipeline's rule,
    spelled out), with the lease it took until ``lease_until`` (the store's now plus a lease).

    A record without a status is new: it gets the seed and audit fields and
    a fresh attempt map. Any other record keeps its fields and adds the
    attempt to its map. Either way the claim's own fields are written and a
    FAILED record's ``retryable``, ``error`` and ``not_before`` go.
    """
    attempt, stamp = documents.next_attempt(before), documents.epoch_ms(moment)
    after = dict(before)
    if before.get("event_status") in (None, ""):
        after.update(documents.insert_fields(FIELDS, moment, created_by=SERVICE,
                                             retention=RETENTION))
        meta, history = dict(FIELDS["entity_metadata"]), {}
    else:
        meta = dict(before.get("entity_metadata") or {})
        history = dict(meta.get("resilienceAttemptCount") or {})
    meta["resilienceAttemptCount"] = {**history, str(attempt): stamp}
    after.pop("error", None)
    after.pop("retryable", None)
    after.pop(documents.NOT_BEFORE, None)
    after.update(event_status=PROCESSING, lease_owner=owner, attempts=attempt,
                 lease_until=lease_until, lastUpdatedTime=stamp,
                 pubsub=FIELDS["pubsub"], entity_metadata=meta)
    return after


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=before_images, jitter=st.integers(0, 999))
def test_the_python_rule_and_each_store_agree_on_the_claim(
        store: EventStore, store_clock: StoreClock, now: datetime, image: dict[str, Any],
        jitter: int) -> None:
    key = new_key()
    lease = image["lease_until"]
    if not exact(store_clock):
        # The server's clock runs on: a lease within SLACK of it may have run
        # out by the claim or not. The memory half pins the boundary exactly.
        assume(not isinstance(lease, timedelta) or abs(lease) > SLACK)
        deferral = image[documents.NOT_BEFORE]
        assume(not isinstance(deferral, timedelta) or abs(deferral) > SLACK)
    mark = store.now()  # the leases are around the store's clock, not the caller's
    put_raw(store, _document(key, image, mark))
    before = store.get(key)
    assert before is not None
    moment = now + timedelta(microseconds=jitter)  # the server only sees milliseconds
    try:
        claim: Claim | None = store.claim(key, FIELDS, moment)
    except AlreadyExists as exc:
        claim = None
        assert without_id(exc.record) == without_id(before)
    taken = claim is not None
    event(f"taken={taken}")
    assert documents.claimable(before, store.now()) is taken
    after = store.get(key)
    assert after is not None
    if claim is None:
        assert without_id(after) == without_id(before)
        return
    assert without_id(claim.record) == without_id(after)
    assert claim.attempt == documents.next_attempt(before)
    assert near(store_clock, after["lease_until"], mark + LEASE)
    assert without_id(after) == without_id(taken_image(before, moment, claim.owner,
                                                       after["lease_until"]))
    assert not any(name.startswith("__eventbus") for name in after)

