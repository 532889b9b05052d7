"""The pure document builders of eventbus.records; the store tests run them on a server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventbus import records
from eventbus.envelope import Delivery
from eventbus.event import EntityMetadata, Event
from eventbus.records import FAILED, PENDING, PROCESSING, SUCCESS

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
        assert records.epoch_ms(SEED_CREATED) == "1655292885101"

    def test_epoch_ms_truncates_microseconds(self) -> None:
        assert records.epoch_ms(SEED_CREATED + timedelta(microseconds=999)) == "1655292885101"

    def test_naive_is_utc_and_other_zones_convert(self) -> None:
        plus2 = SEED_CREATED.astimezone(timezone(timedelta(hours=2)))
        assert records.epoch_ms(SEED_CREATED.replace(tzinfo=None)) == "1655292885101"
        assert records.epoch_ms(plus2) == "1655292885101"

    def test_bson_time_is_aware_utc_milliseconds(self) -> None:
        assert records.bson_time(NOW) == datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
        assert records.bson_time(NOW).tzinfo is UTC

    @pytest.mark.parametrize(("moment", "day"), [
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(1970, 1, 1, 23, 59, 59, 999000, tzinfo=UTC), 0),
        (datetime(1970, 1, 2, tzinfo=UTC), 1),
        (SEED_CREATED, 19158),
        (datetime(1969, 12, 31, 23, 59, tzinfo=UTC), -1),
    ])
    def test_event_day_id_is_whole_days_since_epoch(self, moment: datetime, day: int) -> None:
        assert records.event_day_id(moment) == day

    def test_expire_at_is_created_plus_retention(self) -> None:
        expected = datetime(2026, 5, 31, 12, 0, 0, 123000, tzinfo=UTC)
        assert records.expire_at(NOW, timedelta(days=30)) == expected

    @given(moments)
    def test_ms_string_round_trips(self, moment: datetime) -> None:
        parsed = datetime.fromtimestamp(int(records.epoch_ms(moment)) / 1000, UTC)
        assert abs(parsed - records.bson_time(moment)) < timedelta(milliseconds=1)
        assert records.event_day_id(moment) == (moment.date() - records.EPOCH.date()).days


class TestClaimable:
    LEASE = records.bson_time(NOW)

    @pytest.mark.parametrize(("previous", "expected"), [
        (None, True),
        ({}, True),
        ({"event_status": None}, True),
        ({"event_status": PENDING}, True),
        ({"event_status": FAILED, "retryable": True}, True),
        ({"event_status": FAILED, "retryable": False}, False),
        ({"event_status": FAILED}, False),
        ({"event_status": FAILED, "retryable": 1}, False),
        ({"event_status": SUCCESS}, False),
        ({"event_status": "ARCHIVED"}, False),
        ({"event_status": PROCESSING}, True),
        ({"event_status": PROCESSING, "lease_until": LEASE - timedelta(milliseconds=1)}, True),
        ({"event_status": PROCESSING, "lease_until": LEASE}, False),
        ({"event_status": PROCESSING, "lease_until": LEASE + timedelta(seconds=1)}, False),
    ])
    def test_rule(self, previous: dict[str, object] | None, expected: bool) -> None:
        assert records.claimable(previous, NOW) is expected

    def test_sub_millisecond_now_does_not_expire_a_lease_the_server_keeps(self) -> None:
        lease = records.bson_time(NOW)
        later_in_same_ms = lease + timedelta(microseconds=900)
        assert not records.claimable({"event_status": PROCESSING, "lease_until": lease},
                                     later_in_same_ms)

    def test_naive_lease_is_utc(self) -> None:
        naive = (NOW - timedelta(seconds=1)).replace(tzinfo=None)
        assert records.claimable({"event_status": PROCESSING, "lease_until": naive}, NOW)

    @pytest.mark.parametrize(("previous", "attempt"), [
        (None, 1), ({}, 1), ({"attempts": None}, 1), ({"attempts": 0}, 1), ({"attempts": 4}, 5),
    ])
    def test_next_attempt(self, previous: dict[str, object] | None, attempt: int) -> None:
        assert records.next_attempt(previous) == attempt


class TestEventFields:
    def test_from_an_event(self) -> None:
        fields = records.event_fields(EVENT, DELIVERY, parent_key="p", root_key="r")
        assert fields == {
            "event_type": "OR_MGMT", "event_version": "v2", "event_direction": "IN",
            "entity_metadata": {"partnerId": "p-1", "partnerName": "Acme",
                                "entity_id": "order-1", "entity_type": "Order"},
            "entity_data": {"orderId": 1, "note": "$notAFieldPath"},
            "pubsub": DELIVERY.pubsub_document(), "parent_key": "p", "root_key": "r",
        }

    def test_cascade_links_only_when_given(self) -> None:
        fields = records.event_fields(EVENT, DELIVERY)
        assert "parent_key" not in fields and "root_key" not in fields

    def test_unparseable_payload_gets_defaults(self) -> None:
        delivery = Delivery(data=b"\xff not json", attributes={}, message_id="m")
        fields = records.event_fields(None, delivery)
        assert fields["event_type"] == records.UNKNOWN_TYPE
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
        fields = records.event_fields(None, delivery)
        assert (fields["event_type"], fields["event_version"]) == ("Attr", "")
        assert fields["event_direction"] == "OUT"
        assert fields["entity_metadata"]["partnerId"] == "p-9"
        assert fields["entity_metadata"]["entity_id"] == ""

    def test_salvaged_strings_are_capped(self) -> None:
        delivery = Delivery(data=json.dumps({"event_type": "x" * 10_000}).encode(),
                            attributes={}, message_id="m")
        assert len(records.event_fields(None, delivery)["event_type"]) == 256


class TestUpdates:
    def test_insert_fields_cannot_be_overridden_by_fields(self) -> None:
        inserted = records.insert_fields({"created": "forged", "event_type": "T"}, NOW,
                                         created_by="svc", retention=timedelta(days=1))
        assert inserted == {"created": records.epoch_ms(NOW), "event_type": "T",
                            "createdBy": "svc", "event_day_id": records.event_day_id(NOW),
                            "expire_at": records.bson_time(NOW) + timedelta(days=1)}

    def test_claim_pipeline_passes_publisher_data_as_literals(self) -> None:
        fields = records.event_fields(EVENT, DELIVERY)
        pipeline = records.claim_pipeline(fields, NOW, owner="o", lease=timedelta(seconds=5),
                                          created_by="svc", retention=timedelta(days=1))
        stored = pipeline[1]["$set"]["entity_data"]["$cond"][1]
        assert stored == {"$literal": EVENT.entity_data}
        assert pipeline[-1] == {"$unset": ["__eventbus_new", "__eventbus_take"]}

    def test_succeed_update(self) -> None:
        assert records.succeed_update(NOW) == {
            "$set": {"event_status": SUCCESS, "lastUpdatedTime": records.epoch_ms(NOW)},
            "$unset": {"lease_until": "", "lease_owner": ""}}
        with_children = records.succeed_update(NOW, [{"idempotency_key": "c"}])
        assert with_children["$set"]["outbox"] == [{"idempotency_key": "c"}]

    def test_fail_update(self) -> None:
        error = {"type": "X", "message": "m", "classification": "transient"}
        update = records.fail_update(NOW, error, retryable=True)
        assert update["$set"] == {"event_status": FAILED, "retryable": True, "error": error,
                                  "lastUpdatedTime": records.epoch_ms(NOW)}
        assert update["$unset"] == {"lease_until": "", "lease_owner": ""}

    def test_reject_update_only_sets_on_insert(self) -> None:
        fields = records.event_fields(None, DELIVERY)
        update = records.reject_update(fields, NOW, {"type": "InvalidEvent"}, created_by="svc",
                                       retention=timedelta(days=1), raw_payload="{bad")
        assert list(update) == ["$setOnInsert"]
        record = update["$setOnInsert"]
        assert (record["event_status"], record["retryable"], record["attempts"]) == (
            FAILED, False, 0)
        assert record["raw_payload"] == "{bad"
        assert record["entity_metadata"]["resilienceAttemptCount"] == {}

    def test_reject_without_raw_payload_stores_none(self) -> None:
        update = records.reject_update(records.event_fields(EVENT, DELIVERY), NOW, {},
                                       created_by="svc", retention=timedelta(days=1))
        assert "raw_payload" not in update["$setOnInsert"]

    def test_error_document(self) -> None:
        error = records.error_document(ValueError("x" * 5000), "transient")
        assert error["type"] == "ValueError" and error["classification"] == "transient"
        assert len(error["message"]) == records.MAX_ERROR_MESSAGE
