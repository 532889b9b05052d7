"""The pure document builders of ``eventbus.store.documents``; tests/contract runs them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventbus.clock import Shift
from eventbus.model.delivery import Delivery
from eventbus.model.errors import PublishError
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import fingerprint
from eventbus.store import documents
from eventbus.store.documents import FAILED, PENDING, PROCESSING, PUBLISHED, SUCCESS

# The seed's own example: created "1655292885101" is 2022-06-15T11:34:45.101Z.
SEED_CREATED = datetime(2022, 6, 15, 11, 34, 45, 101000, tzinfo=UTC)
NOW = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)

EVENT = Event(event_type="OR_MGMT", event_version="v2", event_direction="IN",
              entity_metadata=EntityMetadata(partner_id="p-1", entity_id="order-1",
                                             entity_type="Order", partner_name="Acme"),
              entity_data={"orderId": 1, "note": "$notAFieldPath"})
DELIVERY = Delivery(data=b"{}", attributes={"event_type": "OR_MGMT"}, message_id="m-1",
                    publish_time="2026-05-01T12:00:00Z", subscription="projects/p/subs/s",
                    delivery_attempt=3)

moments = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1),
                       timezones=st.just(UTC))


class TestTimes:
    def test_epoch_ms_matches_the_seed(self) -> None:
        assert documents.epoch_ms(SEED_CREATED) == "1655292885101"

    def test_epoch_ms_truncates_microseconds(self) -> None:
        assert documents.epoch_ms(SEED_CREATED + timedelta(microseconds=999)) == "1655292885101"

    def test_naive_is_utc_and_other_zones_convert(self) -> None:
        plus2 = SEED_CREATED.astimezone(timezone(timedelta(hours=2)))
        assert documents.epoch_ms(SEED_CREATED.replace(tzinfo=None)) == "1655292885101"
        assert documents.epoch_ms(plus2) == "1655292885101"

    def test_bson_time_is_aware_utc_milliseconds(self) -> None:
        assert documents.bson_time(NOW) == datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
        assert documents.bson_time(NOW).tzinfo is UTC

    @pytest.mark.parametrize(("moment", "day"), [
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(1970, 1, 1, 23, 59, 59, 999000, tzinfo=UTC), 0),
        (datetime(1970, 1, 2, tzinfo=UTC), 1),
        (SEED_CREATED, 19158),
        (datetime(1969, 12, 31, 23, 59, tzinfo=UTC), -1),
    ])
    def test_event_day_id_is_whole_days_since_epoch(self, moment: datetime, day: int) -> None:
        assert documents.event_day_id(moment) == day

    def test_expire_at_is_created_plus_retention(self) -> None:
        expected = datetime(2026, 5, 31, 12, 0, 0, 123000, tzinfo=UTC)
        assert documents.expire_at(NOW, timedelta(days=30)) == expected

    @given(moments)
    def test_ms_string_round_trips(self, moment: datetime) -> None:
        parsed = datetime.fromtimestamp(int(documents.epoch_ms(moment)) / 1000, UTC)
        assert abs(parsed - documents.bson_time(moment)) < timedelta(milliseconds=1)
        assert documents.event_day_id(moment) == (moment.date() - documents.EPOCH.date()).days


class TestClaimable:
    LEASE = documents.bson_time(NOW)

    @pytest.mark.parametrize(("previous", "expected"), [
        (None, True),
        ({}, True),
        ({"event_status": None}, True),
        ({"event_status": PENDING}, True),
        ({"event_status": FAILED, "retryable": True}, True),
        ({"event_status": FAILED, "retryable": False}, False),
        ({"event_status": FAILED}, False),
        ({"event_status": FAILED, "retryable": 1}, False),
        # A deferral (RetryAfter): not before its time, at it and after it yes.
        ({"event_status": FAILED, "retryable": True, "not_before": LEASE + timedelta(
            milliseconds=1)}, False),
        ({"event_status": FAILED, "retryable": True, "not_before": LEASE}, True),
        ({"event_status": FAILED, "retryable": True, "not_before": LEASE - timedelta(
            seconds=1)}, True),
        ({"event_status": FAILED, "retryable": True, "not_before": None}, True),
        ({"event_status": PENDING, "not_before": LEASE + timedelta(days=1)}, True),
        ({"event_status": SUCCESS}, False),
        ({"event_status": "ARCHIVED"}, False),
        ({"event_status": PROCESSING}, True),
        ({"event_status": PROCESSING, "lease_until": LEASE - timedelta(milliseconds=1)}, True),
        ({"event_status": PROCESSING, "lease_until": LEASE}, False),
        ({"event_status": PROCESSING, "lease_until": LEASE + timedelta(seconds=1)}, False),
    ])
    def test_rule(self, previous: dict[str, object] | None, expected: bool) -> None:
        assert documents.claimable(previous, NOW) is expected

    def test_sub_millisecond_now_does_not_expire_a_lease_the_server_keeps(self) -> None:
        lease = documents.bson_time(NOW)
        later_in_same_ms = lease + timedelta(microseconds=900)
        assert not documents.claimable({"event_status": PROCESSING, "lease_until": lease},
                                     later_in_same_ms)

    def test_naive_lease_is_utc(self) -> None:
        naive = (NOW - timedelta(seconds=1)).replace(tzinfo=None)
        assert documents.claimable({"event_status": PROCESSING, "lease_until": naive}, NOW)

    @pytest.mark.parametrize(("previous", "attempt"), [
        (None, 1), ({}, 1), ({"attempts": None}, 1), ({"attempts": 0}, 1), ({"attempts": 4}, 5),
    ])
    def test_next_attempt(self, previous: dict[str, object] | None, attempt: int) -> None:
        assert documents.next_attempt(previous) == attempt


class TestEventFields:
    def test_from_an_event(self) -> None:
        fields = documents.event_fields(EVENT, DELIVERY, parent_key="p", root_key="r")
        assert fields == {
            "event_type": "OR_MGMT", "event_version": "v2", "event_direction": "IN",
            "entity_metadata": {"partnerId": "p-1", "partnerName": "Acme",
                                "entity_id": "order-1", "entity_type": "Order"},
            "entity_data": {"orderId": 1, "note": "$notAFieldPath"},
            "pubsub": DELIVERY.pubsub_document(), "parent_key": "p", "root_key": "r",
            "payload_fingerprint": fingerprint(EVENT),
        }

    def test_cascade_links_only_when_given(self) -> None:
        fields = documents.event_fields(EVENT, DELIVERY)
        assert "parent_key" not in fields and "root_key" not in fields

    def test_unparseable_payload_gets_defaults(self) -> None:
        delivery = Delivery(data=b"\xff not json", attributes={}, message_id="m")
        fields = documents.refused_fields(delivery, None)
        assert fields["event_type"] == documents.UNKNOWN_TYPE
        assert fields["event_version"] == ""
        assert fields["event_direction"] == "IN"
        assert fields["entity_metadata"] == {"partnerId": "", "partnerName": "",
                                             "entity_id": "", "entity_type": ""}
        assert fields["entity_data"] == {}
        assert fields["pubsub"]["messageId"] == "m"

    def test_invalid_payload_salvages_what_it_can_and_attributes_win(self) -> None:
        body = {"event_type": "Body", "event_version": 7, "event_direction": "OUT",
                "entity_metadata": {"partnerId": "p-9", "entity_id": ["x"]}}
        delivery = Delivery(data=json.dumps(body).encode(),
                            attributes={"event_type": "Attr"}, message_id="m")
        fields = documents.refused_fields(delivery, None)
        assert (fields["event_type"], fields["event_version"]) == ("Attr", "")
        assert fields["event_direction"] == "OUT"
        assert fields["entity_metadata"]["partnerId"] == "p-9"
        assert fields["entity_metadata"]["entity_id"] == ""

    def test_salvaged_strings_are_capped(self) -> None:
        delivery = Delivery(data=json.dumps({"event_type": "x" * 10_000}).encode(),
                            attributes={}, message_id="m")
        assert len(documents.refused_fields(delivery, None)["event_type"]) == 256


class TestUpdates:
    def test_insert_fields_cannot_be_overridden_by_fields(self) -> None:
        inserted = documents.insert_fields({"created": "forged", "event_type": "T"}, NOW,
                                         created_by="svc", retention=timedelta(days=1))
        assert inserted == {"created": documents.epoch_ms(NOW), "event_type": "T",
                            "createdBy": "svc", "event_day_id": documents.event_day_id(NOW),
                            "expire_at": documents.bson_time(NOW) + timedelta(days=1)}

    def test_claim_pipeline_passes_publisher_data_as_literals(self) -> None:
        fields = documents.event_fields(EVENT, DELIVERY)
        pipeline = documents.claim_pipeline(fields, NOW, owner="o", lease=timedelta(seconds=5),
                                          created_by="svc", retention=timedelta(days=1))
        stored = pipeline[1]["$set"]["entity_data"]["$cond"][1]
        assert stored == {"$literal": EVENT.entity_data}
        assert pipeline[-1] == {"$unset": ["__eventbus_new", "__eventbus_take", "__eventbus_redo"]}

    def test_succeed_update(self) -> None:
        assert documents.succeed_update(NOW) == {
            "$set": {"event_status": SUCCESS, "lastUpdatedTime": documents.epoch_ms(NOW)},
            "$unset": {"lease_until": "", "lease_owner": ""}}
        with_children = documents.succeed_update(NOW, [{"idempotency_key": "c"}])
        assert with_children["$set"]["outbox"] == [{"idempotency_key": "c"}]

    def test_fail_update(self) -> None:
        error = {"type": "X", "message": "m", "classification": "transient"}
        update = documents.fail_update(NOW, error, retryable=True)
        assert update["$set"] == {"event_status": FAILED, "retryable": True, "error": error,
                                  "lastUpdatedTime": documents.epoch_ms(NOW)}
        assert update["$unset"] == {"lease_until": "", "lease_owner": ""}

    def test_reject_update_only_sets_on_insert(self) -> None:
        fields = documents.refused_fields(DELIVERY, None)
        update = documents.reject_update(fields, NOW, {"type": "InvalidEvent"}, created_by="svc",
                                       retention=timedelta(days=1), raw_payload="{bad")
        assert list(update) == ["$setOnInsert"]
        record = update["$setOnInsert"]
        assert (record["event_status"], record["retryable"], record["attempts"]) == (
            FAILED, False, 0)
        assert record["raw_payload"] == "{bad"
        assert record["entity_metadata"]["resilienceAttemptCount"] == {}

    def test_reject_without_raw_payload_stores_none(self) -> None:
        update = documents.reject_update(documents.event_fields(EVENT, DELIVERY), NOW, {},
                                       created_by="svc", retention=timedelta(days=1))
        assert "raw_payload" not in update["$setOnInsert"]

    def test_error_document(self) -> None:
        error = documents.error_document(ValueError("x" * 5000), "transient")
        assert error["type"] == "ValueError" and error["classification"] == "transient"
        assert len(error["message"]) == documents.MAX_ERROR_MESSAGE


class TestIsNew:
    @pytest.mark.parametrize(("previous", "new"), [
        (None, True), ({}, True), ({"event_status": None}, True), ({"event_status": ""}, True),
        ({"event_status": PENDING}, False), ({"event_status": PROCESSING}, False),
        ({"event_status": FAILED, "retryable": True}, False),
    ])
    def test_a_record_without_a_status_is_new(self, previous: dict[str, object] | None,
                                              new: bool) -> None:
        assert documents.is_new(previous) is new

    def test_the_pipeline_decides_new_on_the_same_field(self) -> None:
        pipeline = documents.claim_pipeline({}, NOW, owner="o", lease=timedelta(seconds=5),
                                            created_by="svc", retention=timedelta(days=1))
        assert pipeline[0]["$set"]["__eventbus_new"] == {
            "$eq": [{"$ifNull": ["$event_status", ""]}, ""]}


class TestOutboxBuilders:
    def test_published_update(self) -> None:
        done = documents.published_update(2, NOW, "m-1", 3)
        assert done["$set"] == {"outbox.2.status": PUBLISHED,
                                "outbox.2.published_at": documents.bson_time(NOW),
                                "outbox.2.messageId": "m-1"}
        assert done["$inc"] == {"outbox.2.publish_attempts": 3}
        assert done["$unset"] == {"outbox.2.last_error": ""}

    def test_failed_update_keeps_the_entry_pending(self) -> None:
        error = documents.error_document(PublishError("down"), "transient")
        failed = documents.failed_update(2, NOW, error, 4)
        assert "outbox.2.status" not in failed["$set"]
        assert failed["$set"]["outbox.2.last_error"] == {
            "type": "PublishError", "message": "down", "classification": "transient"}
        assert failed["$set"]["outbox.2.last_attempt_at"] == documents.bson_time(NOW)
        assert failed["$inc"] == {"outbox.2.publish_attempts": 4}

    def test_pending_filter_makes_both_conditions_hold_for_one_entry(self) -> None:
        assert documents.pending_filter(NOW) == {
            "outbox.status": PENDING,
            "outbox": {"$elemMatch": {"status": PENDING, "created_at": {"$lte": NOW}}}}

    @pytest.mark.parametrize(("entry", "pending"), [
        ({"status": PENDING, "created_at": NOW}, True),
        ({"status": PENDING, "created_at": NOW - timedelta(seconds=1)}, True),
        ({"status": PENDING, "created_at": NOW + timedelta(microseconds=500)}, True),
        ({"status": PENDING, "created_at": NOW + timedelta(milliseconds=1)}, False),
        ({"status": PUBLISHED, "created_at": NOW}, False),
        ({"status": PENDING}, False),
        ({"status": PENDING, "created_at": "yesterday"}, False),
    ])
    def test_entry_pending(self, entry: dict[str, object], pending: bool) -> None:
        assert documents.entry_pending(entry, NOW) is pending


class TestGuardBuilders:
    def test_the_take_rule_is_decided_on_the_stores_clock(self) -> None:
        held = documents.bson_time(NOW)
        assert documents.guard_takeable(None, NOW)
        assert documents.guard_takeable({"status": FAILED}, NOW)
        assert documents.guard_takeable({"status": PROCESSING,
                                         "lease_until": held - timedelta(milliseconds=1)}, NOW)
        assert not documents.guard_takeable({"status": PROCESSING, "lease_until": held}, NOW)
        assert not documents.guard_takeable({"status": SUCCESS}, NOW)
        # MongoDB's form compares with $$NOW, shifted only by a test's Shift.
        text = repr(documents.guard_take(NOW, "o", timedelta(seconds=5)))
        assert "'$$NOW'" in text and repr(held) not in text.split("updated_at")[0]
        shifted = repr(documents.guard_take(NOW, "o", timedelta(seconds=5), Shift(60)))
        assert "{'$add': ['$$NOW', 60000]}" in shifted and "{'$add': ['$$NOW', 65000]}" in shifted

    def test_take_leaves_what_the_memory_store_writes(self) -> None:
        moment = documents.bson_time(NOW)
        taken = documents.guard_taken(None, NOW, "o", timedelta(seconds=5))
        assert taken == {"status": PROCESSING, "lease_owner": "o", "attempts": 1,
                         "lease_until": moment + timedelta(seconds=5), "updated_at": moment,
                         "created_at": moment}

    def test_owner_filter_guards_only_failures(self) -> None:
        assert documents.guard_owner_filter("k", "o", succeeded=True) == {"_id": "k"}
        assert documents.guard_owner_filter("k", "o", succeeded=False) == {"_id": "k",
                                                                           "lease_owner": "o"}

    def test_finish_updates(self) -> None:
        moment = documents.bson_time(NOW)
        assert documents.guard_finish_update(NOW, succeeded=True, result={"status_code": 200}) \
            == {"$set": {"status": SUCCESS, "updated_at": moment, "done_at": moment,
                         "result": {"status_code": 200}},
                "$unset": {"lease_until": "", "lease_owner": "", "error": ""}}
        assert documents.guard_finish_update(NOW, succeeded=False, result={"type": "X"}) == {
            "$set": {"status": FAILED, "updated_at": moment, "error": {"type": "X"}},
            "$unset": {"lease_until": "", "lease_owner": ""}}


class TestSummaries:
    def test_cascade_filter_finds_roots_and_descendants(self) -> None:
        assert documents.cascade_filter(["b", "a"]) == {
            "$or": [{"idempotency_key": {"$in": ["a", "b"]}}, {"root_key": {"$in": ["a", "b"]}}]}

    def test_summary_keeps_the_summary_fields_and_child_keys(self) -> None:
        record = {"_id": 1, "idempotency_key": "k", "event_type": "T", "event_status": SUCCESS,
                  "entity_data": {"x": 1},
                  "outbox": [{"idempotency_key": "k/0:A", "status": PENDING}, {}]}
        assert documents.summary(record) == {
            "idempotency_key": "k", "event_type": "T", "event_status": SUCCESS,
            "outbox": [{"idempotency_key": "k/0:A"}, {"idempotency_key": None}]}


def test_a_hold_holds_a_new_entity_or_a_free_one_not_ahead() -> None:
    # ``holdable`` is the memory store's form of ``hold_filter`` (MongoDB's query).
    assert documents.holdable(None, 5)
    assert documents.holdable({"idempotency_key": "entity:x"}, 5)  # released before any SUCCESS
    assert documents.holdable({"position": 5}, 5) and documents.holdable({"position": 4.5}, 5)
    assert not documents.holdable({"position": 6}, 5)
    assert not documents.holdable({"holder": {"owner": "o", "until": NOW}}, 5)
    held = documents.hold_filter("entity:x", 5)
    assert held["holder"] == {"$exists": False}
    # An untagged position (stored before kinds were) is held as before; a kind only
    # when it is the take's (issue 39, fault 8).
    assert {"position": {"$lte": 5}, "position_kind": {"$exists": False}} in held["$or"]
    assert {"position": {"$lte": 5}, "position_kind": "time"} in \
        documents.hold_filter("entity:x", 5, "time")["$or"]
    assert documents.holdable({"position": 5, "position_kind": "time"}, 5, "time")
    assert not documents.holdable({"position": 5, "position_kind": "time"}, 5, "number")
    assert not documents.holdable({"position": 5, "position_kind": "time"}, 5)  # a mixed take
    assert held["orphan"] is None  # an entity with orphans is taken the full way
    assert not documents.holdable({"orphan": {"keys": ["k"], "positions": [1]}}, 5)
    [update] = documents.hold_update({"partnerId": "p"}, "o", NOW, timedelta(seconds=30),
                                     ["k"], [5])
    assert update["$set"]["holder"]["owner"] == "o"
    assert update["$set"]["holder"]["until"] == {"$add": ["$$NOW", 30000]}  # the store's clock
    assert update["$set"]["record_type"] == {"$ifNull": ["$record_type", "entity"]}


def test_a_release_moves_the_position_only_forward_and_keeps_given_orphans() -> None:
    # ``released`` is the memory store's form of ``release_update``.
    record: dict[str, object] = {"position": 7, "applied_key": "k7",
                                 "holder": {"owner": "o"}, "orphan": {"keys": ["a"]}}
    documents.released(record, NOW, 5, "k5")
    assert (record["position"], record["applied_key"]) == (7, "k7")
    assert "holder" not in record and "orphan" not in record
    kept: dict[str, list[Any]] = {"keys": ["b"], "positions": [3]}
    documents.released(record, NOW, 9, "k9", kept)
    assert (record["position"], record["applied_key"], record["orphan"]) == (9, "k9", kept)
    assert "{'$literal': {'keys': ['b'], 'positions': [3]}}" in repr(
        documents.release_update(NOW, 9, "k9", kept))
