"""MongoEventStore against a real MongoDB-compatible server (tests/conftest.py)."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pymongo import ReturnDocument
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, PyMongoError

from eventbus import records
from eventbus.config import Settings
from eventbus.envelope import Delivery
from eventbus.errors import AlreadyExists, StoreUnavailable
from eventbus.event import EntityMetadata, Event
from eventbus.metrics import round_trips
from eventbus.records import FAILED, PENDING, PROCESSING, SUCCESS
from eventbus.store import Claim, MongoEventStore

LEASE = timedelta(seconds=60)
EVENT = Event(event_type="OR_MGMT", event_version="v2", event_direction="IN",
              entity_metadata=EntityMetadata(partner_id="p-1", entity_id="order-1",
                                             entity_type="Order", partner_name="Acme"),
              entity_data={"orderId": 59734, "status": "$OR_PLC", "lines": [{"sku": "a"}]})
DELIVERY = Delivery(data=b"{}", attributes={}, message_id="m-1",
                    publish_time="2026-05-01T12:00:00Z", subscription="projects/p/subs/s",
                    delivery_attempt=1)
FIELDS = records.event_fields(EVENT, DELIVERY)
ERROR = {"type": "PartnerUnavailable", "message": "503", "classification": "transient"}


@pytest.fixture()
def now() -> datetime:
    # Real time, not a fixed date: the server's TTL monitor deletes records
    # whose expire_at (created + retention) has passed.
    return records.bson_time(datetime.now(UTC))


@pytest.fixture()
def store(mongo_uri: str, mongo_db: Database) -> Iterator[MongoEventStore]:
    config = Settings(mongodb_uri=mongo_uri, mongodb_db=mongo_db.name, service="test-svc",
                      lease_seconds=LEASE.total_seconds())
    built = MongoEventStore.from_settings(config)
    built.ensure_indexes()
    yield built
    built.database.client.close()


def new_key() -> str:
    return f"order-1:OR_MGMT:{uuid.uuid4().hex}"


def assert_unchanged(store: MongoEventStore, key: str, before: dict[str, Any] | None) -> None:
    assert store.get(key) == before


class TestIndexes:
    def test_indexes_have_the_seed_keys_and_options(self, store: MongoEventStore) -> None:
        store.ensure_indexes()  # a second time is a no-op
        info = store.collection.index_information()
        keys = {name: list(spec["key"]) for name, spec in info.items()}
        assert keys == {
            "_id_": [("_id", 1)],
            "entity_metadata.partnerId_1_created_-1": [("entity_metadata.partnerId", 1),
                                                       ("created", -1)],
            "event_status_1_event_type_1": [("event_status", 1), ("event_type", 1)],
            "expire_at_1": [("expire_at", 1)],
            "entity_metadata.entity_id_1_entity_metadata.entity_type_1": [
                ("entity_metadata.entity_id", 1), ("entity_metadata.entity_type", 1)],
            "idempotency_key_1": [("idempotency_key", 1)],
            "outbox.status_1": [("outbox.status", 1)],
        }
        assert info["idempotency_key_1"].get("unique") is True
        assert info["expire_at_1"].get("expireAfterSeconds") == 0

    def test_unique_key_is_enforced(self, store: MongoEventStore) -> None:
        store.collection.insert_one({"idempotency_key": "k"})
        with pytest.raises(DuplicateKeyError):
            store.collection.insert_one({"idempotency_key": "k"})


class TestClaim:
    def test_new_record_gets_attempt_one_and_every_seed_field(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert (claim.attempt, claim.previous) == (1, None)
        assert len(claim.owner) == 32 and int(claim.owner, 16) >= 0
        record = store.get(key)
        assert record is not None
        stamp = records.epoch_ms(now)
        assert {name: record[name] for name in record if name != "_id"} == {
            "idempotency_key": key, "event_type": "OR_MGMT", "event_version": "v2",
            "event_direction": "IN", "event_status": PROCESSING,
            "event_day_id": records.event_day_id(now),
            "entity_metadata": {"partnerId": "p-1", "partnerName": "Acme",
                                "entity_id": "order-1", "entity_type": "Order",
                                "resilienceAttemptCount": {"1": stamp}},
            "entity_data": EVENT.entity_data, "pubsub": DELIVERY.pubsub_document(),
            "created": stamp, "lastUpdatedTime": stamp, "createdBy": "test-svc",
            "expire_at": now + timedelta(days=30), "attempts": 1,
            "lease_until": now + LEASE, "lease_owner": claim.owner,
        }
        assert isinstance(record["event_day_id"], int) and isinstance(record["created"], str)
        assert record["expire_at"].tzinfo is not None

    def test_live_lease_raises_already_exists_with_the_record(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        before = store.get(key)
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE - timedelta(milliseconds=1))
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_expired_lease_is_taken_as_attempt_two(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        first = store.claim(key, FIELDS, now)
        later = now + LEASE + timedelta(milliseconds=1)
        redelivery = {**FIELDS, "pubsub": {**FIELDS["pubsub"], "deliveryAttempt": 2}}
        second = store.claim(key, redelivery, later)
        assert second.attempt == 2 and second.owner != first.owner
        assert second.previous is not None and second.previous["lease_owner"] == first.owner
        record = store.get(key)
        assert record is not None
        assert record["entity_metadata"]["resilienceAttemptCount"] == {
            "1": records.epoch_ms(now), "2": records.epoch_ms(later)}
        assert record["attempts"] == 2 and record["lease_until"] == later + LEASE
        assert record["pubsub"]["deliveryAttempt"] == 2
        assert record["created"] == records.epoch_ms(now)
        assert record["lastUpdatedTime"] == records.epoch_ms(later)
        assert not store.succeed(key, first.owner, later)

    def test_failed_retryable_is_taken_and_loses_its_error(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        first = store.claim(key, FIELDS, now)
        assert store.fail(key, first.owner, now, ERROR, retryable=True)
        second = store.claim(key, FIELDS, now + timedelta(seconds=1))
        assert second.attempt == 2
        assert second.previous is not None and second.previous["error"] == ERROR
        record = store.get(key)
        assert record is not None and record["event_status"] == PROCESSING
        assert "error" not in record and "retryable" not in record

    def test_failed_for_good_is_not_taken(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.fail(key, claim.owner, now, ERROR, retryable=False)
        before = store.get(key)
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE * 2)
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_success_is_not_taken_and_stays_unchanged(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        before = store.get(key)
        assert before is not None and before["event_status"] == SUCCESS
        with pytest.raises(AlreadyExists) as raised:
            store.claim(key, FIELDS, now + LEASE * 2)
        assert raised.value.record == before
        assert_unchanged(store, key, before)

    def test_pending_record_written_elsewhere_is_taken(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        store.collection.insert_one({"idempotency_key": key, "event_status": PENDING,
                                     "created": "1", "entity_metadata": {"partnerId": "x"}})
        claim = store.claim(key, FIELDS, now)
        record = store.get(key)
        assert claim.attempt == 1 and record is not None
        assert record["created"] == "1"  # insert fields belong to new records only
        assert record["entity_metadata"] == {
            "partnerId": "x", "resilienceAttemptCount": {"1": records.epoch_ms(now)}}


class TestFinish:
    def test_succeed_stores_children_and_drops_the_lease(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        children = [{"idempotency_key": f"{key}/0:Sub", "status": "PENDING"}]
        assert store.succeed(key, claim.owner, now + timedelta(seconds=2), children)
        record = store.get(key)
        assert record is not None
        assert record["event_status"] == SUCCESS and record["outbox"] == children
        assert record["lastUpdatedTime"] == records.epoch_ms(now + timedelta(seconds=2))
        assert "lease_until" not in record and "lease_owner" not in record

    def test_succeed_without_children_has_no_outbox(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        record = store.get(key)
        assert record is not None and "outbox" not in record

    def test_fail_records_error_and_retryable(self, store: MongoEventStore,
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
    def test_a_stale_owner_changes_nothing(self, store: MongoEventStore, now: datetime,
                                           finish: str) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        before = store.get(key)
        if finish == "succeed":
            assert store.succeed(key, "stale", now, [{"idempotency_key": "c"}]) is False
        else:
            assert store.fail(key, "stale", now, ERROR, retryable=True) is False
        assert_unchanged(store, key, before)

    def test_finishing_twice_is_refused(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        assert store.succeed(key, claim.owner, now)
        assert not store.fail(key, claim.owner, now, ERROR, retryable=True)

    def test_finishing_an_unknown_key_is_refused(self, store: MongoEventStore,
                                                 now: datetime) -> None:
        assert not store.succeed(new_key(), "owner", now)
        assert store.collection.count_documents({}) == 0


class TestReject:
    def test_reject_twice_stores_one_record(self, store: MongoEventStore,
                                            now: datetime) -> None:
        key = f"invalid:{uuid.uuid4().hex}"
        fields = records.event_fields(None, Delivery(data=b"{bad", attributes={},
                                                     message_id="m-9"))
        error = {"type": "InvalidEvent", "message": "not JSON", "classification": "invalid"}
        assert store.reject(key, fields, now, error, raw_payload="{bad") is True
        before = store.get(key)
        assert store.reject(key, fields, now + timedelta(seconds=1), ERROR, "other") is False
        assert_unchanged(store, key, before)
        assert store.collection.count_documents({"idempotency_key": key}) == 1
        assert before is not None
        assert (before["event_status"], before["retryable"], before["error"]) == (
            FAILED, False, error)
        assert before["raw_payload"] == "{bad" and before["event_type"] == "UNKNOWN"
        assert before["attempts"] == 0 and before["createdBy"] == "test-svc"
        assert isinstance(before["expire_at"], datetime)

    def test_reject_never_changes_an_existing_record(self, store: MongoEventStore,
                                                     now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        before = store.get(key)
        assert store.reject(key, FIELDS, now, ERROR) is False
        assert_unchanged(store, key, before)

    def test_rejected_record_is_not_claimable(self, store: MongoEventStore,
                                              now: datetime) -> None:
        key = new_key()
        store.reject(key, FIELDS, now, ERROR)
        with pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, now)


class TestConcurrency:
    @pytest.mark.parametrize("state", ["new", "expired lease", "failed retryable"])
    def test_sixteen_claims_of_one_key_make_one_winner(
            self, store: MongoEventStore, now: datetime, state: str) -> None:
        key, workers = new_key(), 16
        if state != "new":
            first = store.claim(key, FIELDS, now - LEASE * 2)
            if state == "failed retryable":
                store.fail(key, first.owner, now - LEASE * 2, ERROR, retryable=True)
        barrier = threading.Barrier(workers)
        results: list[Claim | BaseException] = []

        def claim() -> None:
            barrier.wait()
            try:
                results.append(store.claim(key, FIELDS, now))
            except BaseException as exc:  # collected and asserted below
                results.append(exc)

        threads = [threading.Thread(target=claim) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claims = [result for result in results if isinstance(result, Claim)]
        others = [result for result in results if not isinstance(result, Claim)]
        assert len(claims) == 1, results
        assert claims[0].attempt == (1 if state == "new" else 2)
        assert len(others) == 15 and all(isinstance(exc, AlreadyExists) for exc in others), others
        assert store.collection.count_documents({"idempotency_key": key}) == 1


class _DuplicateFirst:
    """A collection that fails the first ``failures`` claims as a racing upsert would."""

    def __init__(self, collection: Any, failures: int) -> None:
        self._collection, self.failures = collection, failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise DuplicateKeyError("E11000 duplicate key error", 11000)
        return self._collection.find_one_and_update(*args, **kwargs)


class TestDuplicateKeyRetry:
    def test_one_duplicate_key_error_is_retried(self, store: MongoEventStore,
                                                now: datetime) -> None:
        racing = MongoEventStore(_DuplicateFirst(store.collection, 1), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        assert racing.claim(new_key(), FIELDS, now).attempt == 1

    def test_a_second_one_is_unavailable(self, store: MongoEventStore, now: datetime) -> None:
        racing = MongoEventStore(_DuplicateFirst(store.collection, 2), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        with pytest.raises(StoreUnavailable) as raised:
            racing.claim(new_key(), FIELDS, now)
        assert isinstance(raised.value.__cause__, DuplicateKeyError)


class TestRoundTrips:
    def test_new_event_costs_two(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        with round_trips.measure() as sent:
            claim = store.claim(key, FIELDS, now)
            store.succeed(key, claim.owner, now, [{"idempotency_key": "c"}])
        assert sent.count == 2, sent.commands

    def test_duplicate_of_a_finished_event_costs_one(self, store: MongoEventStore,
                                                     now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        store.succeed(key, claim.owner, now)
        with round_trips.measure() as sent, pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, now)
        assert sent.commands == ["findAndModify"]

    def test_reject_and_get_cost_one_each(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        with round_trips.measure() as rejecting:
            store.reject(key, FIELDS, now, ERROR)
        with round_trips.measure() as reading:
            store.get(key)
        assert (rejecting.commands, reading.commands) == (["update"], ["find"])

    def test_other_threads_are_not_counted(self, store: MongoEventStore, now: datetime) -> None:
        with round_trips.measure() as sent:
            thread = threading.Thread(target=store.get, args=("elsewhere",))
            thread.start()
            thread.join()
        assert sent.count == 0


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class TestFromSettings:
    def test_client_is_tz_aware_times_out_and_counts_round_trips(self) -> None:
        config = Settings(mongodb_uri="mongodb://127.0.0.1:1/", mongodb_db="db", collection="c",
                          service="svc-x", store_timeout_ms=1234)
        built = MongoEventStore.from_settings(config)  # connects lazily: no server needed
        client = built.database.client
        try:
            options = client.options
            assert client.codec_options.tz_aware is True
            assert options.server_selection_timeout == 1.234
            assert options.pool_options.connect_timeout == 1.234
            assert options.pool_options.socket_timeout == 1.234
            assert options.pool_options.metadata["application"] == {"name": "svc-x"}
            assert round_trips in options.event_listeners
            assert built.collection.full_name == "db.c"
            assert built.lease == timedelta(seconds=60)
        finally:
            client.close()


class TestUnavailable:
    @pytest.fixture()
    def down(self) -> Iterator[MongoEventStore]:
        config = Settings(mongodb_uri=f"mongodb://127.0.0.1:{_closed_port()}/",
                          store_timeout_ms=200)
        built = MongoEventStore.from_settings(config)
        yield built
        built.database.client.close()

    @pytest.mark.parametrize("call", ["claim", "succeed", "fail", "reject", "get",
                                      "ensure_indexes"])
    def test_every_primitive_raises_store_unavailable_quickly(
            self, down: MongoEventStore, call: str) -> None:
        now = datetime.now(UTC)
        calls = {
            "claim": lambda: down.claim("k", FIELDS, now),
            "succeed": lambda: down.succeed("k", "owner", now),
            "fail": lambda: down.fail("k", "owner", now, ERROR, retryable=True),
            "reject": lambda: down.reject("k", FIELDS, now, ERROR),
            "get": lambda: down.get("k"),
            "ensure_indexes": down.ensure_indexes,
        }
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            calls[call]()
        assert time.monotonic() - started < 3
        assert isinstance(raised.value.__cause__, PyMongoError)


# --- the claim rule, in the pipeline and in Python, on generated records ---

MISSING = object()
_ms = st.integers(-3, 3) | st.integers(-10**7, 10**7)
before_images = st.fixed_dictionaries({
    "event_status": st.sampled_from([MISSING, None, "", PENDING, PROCESSING, SUCCESS, FAILED,
                                     "ARCHIVED"]),
    "retryable": st.sampled_from([MISSING, True, False, None, 1, 0, "true"]),
    "lease_until": st.just(MISSING) | st.none() | _ms.map(lambda ms: timedelta(milliseconds=ms)),
    "attempts": st.just(MISSING) | st.none() | st.integers(0, 6),
    "entity_metadata": st.just(MISSING) | st.fixed_dictionaries(
        {"partnerId": st.just("old")},
        optional={"resilienceAttemptCount": st.dictionaries(
            st.sampled_from("12345"), st.just("0"), max_size=3)}),
    "error": st.just(MISSING) | st.just(ERROR),
    "created": st.just(MISSING) | st.just("1"),
})


def _insert(store: MongoEventStore, key: str, image: dict[str, Any], now: datetime) -> None:
    document: dict[str, Any] = {"idempotency_key": key}
    for name, value in image.items():
        if value is not MISSING:
            document[name] = now + value if isinstance(value, timedelta) else value
    store.collection.insert_one(document)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=before_images, jitter=st.integers(0, 999))
def test_pipeline_and_python_agree_on_the_claim_rule(
        store: MongoEventStore, now: datetime, image: dict[str, Any], jitter: int) -> None:
    key = new_key()
    _insert(store, key, image, now)
    moment = now + timedelta(microseconds=jitter)  # the server only sees milliseconds
    pipeline = records.claim_pipeline(FIELDS, moment, owner="probe", lease=LEASE,
                                      created_by="svc", retention=timedelta(days=1))
    before = store.collection.find_one_and_update(
        {"idempotency_key": key}, pipeline, upsert=True, return_document=ReturnDocument.BEFORE)
    after = store.get(key)
    assert before is not None and after is not None
    taken = after.get("lease_owner") == "probe"
    event(f"taken={taken}")
    assert records.claimable(before, moment) is taken
    if not taken:
        assert after == before
        return
    attempt = records.next_attempt(before)
    assert after["attempts"] == attempt and after["event_status"] == PROCESSING
    history = after["entity_metadata"]["resilienceAttemptCount"]
    assert history[str(attempt)] == records.epoch_ms(now)
    assert "error" not in after and "retryable" not in after
    assert not any(name.startswith("__eventbus") for name in after)
