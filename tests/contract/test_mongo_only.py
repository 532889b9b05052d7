"""What only ``MongoEventStore`` has: indexes, round trips, the driver's errors, its settings.

The storage semantics both stores share are in ``test_store_contract.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import MongoClient, monitoring
from pymongo.database import Database
from pymongo.errors import AutoReconnect, DuplicateKeyError, PyMongoError

from eventbus.clock import Shift
from eventbus.model.errors import AlreadyExists, LeaseHeld, StoreUnavailable
from eventbus.settings import Settings
from eventbus.store.base import Finish, OutboxEntry
from eventbus.store.mongo import INDEXES, OUTBOX_INDEX, MongoEventStore
from eventbus.store.roundtrips import RoundTrips
from tests.contract.conftest import ERROR, FIELDS, LEASE, mongo_settings, new_key


@pytest.fixture()
def shift() -> Shift:
    """The store's clock offset: ``advance`` it to let time pass on the server's clock."""
    return Shift()


@pytest.fixture()
def store(mongo_uri: str, mongo_db: Database, shift: Shift) -> Iterator[MongoEventStore]:
    built = MongoEventStore.from_settings(mongo_settings(mongo_uri, mongo_db.name),
                                          count_round_trips=True, shift=shift)
    built.ensure_indexes()
    yield built
    built.close()


def outbox_entry(parent: str, index: int, created_at: datetime) -> dict[str, Any]:
    return {"idempotency_key": f"{parent}/{index}:Sub", "event_type": "Sub",
            "event_version": "v1", "status": "PENDING", "publish_attempts": 0,
            "created_at": created_at}


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
            "redrive_at_1": [("redrive_at", 1)],
        }
        assert info["idempotency_key_1"].get("unique") is True
        assert info["expire_at_1"].get("expireAfterSeconds") == 0
        assert {model.document["name"] for model in INDEXES} == set(keys) - {"_id_"}

    def test_the_outbox_index_is_one_of_the_indexes(self) -> None:
        assert OUTBOX_INDEX in {model.document["name"] for model in INDEXES}

    def test_unique_key_is_enforced(self, store: MongoEventStore) -> None:
        store.collection.insert_one({"idempotency_key": "k"})
        with pytest.raises(DuplicateKeyError):
            store.collection.insert_one({"idempotency_key": "k"})

    def test_reset_empties_the_collections_and_keeps_the_indexes(
            self, store: MongoEventStore, now: datetime) -> None:
        store.claim(new_key(), FIELDS, now)
        store.guard_take("effect", "a", now, LEASE)
        before = store.collection.index_information()
        store.reset()
        assert store.collection.count_documents({}) == 0
        assert store.database["side_effects"].count_documents({}) == 0
        assert store.collection.index_information() == before


class TestCollections:
    def test_events_and_guards_live_in_the_configured_collections(
            self, mongo_uri: str, mongo_db: Database, now: datetime) -> None:
        built = MongoEventStore.from_settings(mongo_settings(
            mongo_uri, mongo_db.name, collection="events_x", guard_collection="effects_x"))
        try:
            key = new_key()
            built.claim(key, FIELDS, now)
            built.guard_take("effect", "a", now, LEASE)
            assert built.database.name == mongo_db.name
            assert mongo_db["events_x"].count_documents({"idempotency_key": key}) == 1
            assert mongo_db["effects_x"].count_documents({"_id": "effect"}) == 1
        finally:
            built.close()


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

    def test_the_retry_sees_the_record_the_other_upsert_inserted(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        store.claim(key, FIELDS, now)
        racing = MongoEventStore(_DuplicateFirst(store.collection, 1), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        with pytest.raises(AlreadyExists):
            racing.claim(key, FIELDS, now)

    def test_a_second_one_is_unavailable(self, store: MongoEventStore, now: datetime) -> None:
        racing = MongoEventStore(_DuplicateFirst(store.collection, 2), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        with pytest.raises(StoreUnavailable) as raised:
            racing.claim(new_key(), FIELDS, now)
        assert isinstance(raised.value.__cause__, DuplicateKeyError)

    def test_a_racing_reject_is_not_inserted_twice(self, store: MongoEventStore,
                                                   now: datetime) -> None:
        class DuplicateUpdate(_DuplicateFirst):
            def update_one(self, *args: Any, **kwargs: Any) -> Any:
                raise DuplicateKeyError("E11000 duplicate key error", 11000)

        racing = MongoEventStore(DuplicateUpdate(store.collection, 0), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        assert racing.reject(new_key(), FIELDS, now, ERROR) is False


class TestRoundTrips:
    def test_a_claim_is_one_round_trip(self, store: MongoEventStore, now: datetime) -> None:
        with store.round_trips.measure() as sent:
            store.claim(new_key(), FIELDS, now)
        assert sent.commands == ["findAndModify"]

    def test_new_event_costs_two(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        with store.round_trips.measure() as sent:
            claim = store.claim(key, FIELDS, now)
            store.succeed(key, claim.owner, now, [{"idempotency_key": "c"}])
        assert sent.commands == ["findAndModify", "update"]

    @pytest.mark.parametrize("state", ["success", "failed for good", "live lease"])
    def test_a_duplicate_costs_one(self, store: MongoEventStore, now: datetime,
                                   state: str) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        if state == "success":
            store.succeed(key, claim.owner, now)
        elif state == "failed for good":
            store.fail(key, claim.owner, now, ERROR, retryable=False)
        with store.round_trips.measure() as sent, pytest.raises(AlreadyExists):
            store.claim(key, FIELDS, now)
        assert sent.commands == ["findAndModify"]

    def test_reject_and_get_cost_one_each(self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        with store.round_trips.measure() as rejecting:
            store.reject(key, FIELDS, now, ERROR)
        with store.round_trips.measure() as reading:
            store.get(key)
        assert (rejecting.commands, reading.commands) == (["update"], ["find"])

    def test_outbox_primitives_cost_one_each(self, store: MongoEventStore,
                                             now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        store.succeed(key, claim.owner, now, [outbox_entry(key, 0, now),
                                              outbox_entry(key, 1, now)])
        with store.round_trips.measure() as sweeping:
            first, second = list(store.pending_outbox(now))
        with store.round_trips.measure() as marking:
            store.mark_published(first, now, "m-1", 1)
        with store.round_trips.measure() as failing:
            store.mark_publish_failed(second, now, ERROR, 1)
        assert (sweeping.commands, marking.commands, failing.commands) == (
            ["find"], ["update"], ["update"])

    def test_guard_primitives_cost_one_each_held_or_not(
            self, store: MongoEventStore, now: datetime) -> None:
        # The take is decided on the server's clock in its one findAndModify,
        # which also returns the record: a held effect costs no second read.
        with store.round_trips.measure() as taking:
            store.guard_take("effect", "a", now, LEASE)
        with store.round_trips.measure() as held, pytest.raises(LeaseHeld):
            store.guard_take("effect", "b", now, LEASE)
        with store.round_trips.measure() as renewing:
            assert store.guard_renew("effect", "a", LEASE)
        with store.round_trips.measure() as finishing:
            store.guard_finish("effect", "a", now, succeeded=True, result={})
        with store.round_trips.measure() as done:
            assert store.guard_take("effect", "b", now, LEASE) is not None
        assert taking.commands == held.commands == done.commands == ["findAndModify"]
        assert renewing.commands == finishing.commands == ["update"]

    def test_other_threads_are_not_counted(self, store: MongoEventStore) -> None:
        with store.round_trips.measure() as sent:
            thread = threading.Thread(target=store.get, args=("elsewhere",))
            thread.start()
            thread.join()
        assert sent.count == 0

    def test_each_store_counts_only_its_own_client(self, store: MongoEventStore,
                                                   mongo_uri: str, mongo_db: Database) -> None:
        other = MongoEventStore.from_settings(mongo_settings(mongo_uri, mongo_db.name),
                                              count_round_trips=True)
        try:
            with store.round_trips.measure() as mine, other.round_trips.measure() as theirs:
                other.get("k")
            assert (mine.count, theirs.count) == (0, 1)
        finally:
            other.close()


class _Commands(monitoring.CommandListener):
    """Keeps every command sent, to read what the store asked the server for."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class TestOutboxSweep:
    def test_the_sweep_query_is_pinned_to_the_outbox_index(
            self, mongo_uri: str, mongo_db: Database, now: datetime) -> None:
        commands = _Commands()
        client: MongoClient = MongoClient(mongo_uri, tz_aware=True, event_listeners=[commands])
        built = MongoEventStore.from_settings(mongo_settings(mongo_uri, mongo_db.name), client)
        try:
            built.ensure_indexes()
            key = new_key()
            claim = built.claim(key, FIELDS, now)
            built.succeed(key, claim.owner, now, [outbox_entry(key, 0, now)])
            commands.sent.clear()
            assert [entry.key for entry in built.pending_outbox(now)] == [f"{key}/0:Sub"]
            (find,) = [command for command in commands.sent if "find" in command]
            assert find["hint"] == OUTBOX_INDEX
            assert find["filter"]["outbox.status"] == "PENDING"
        finally:
            client.close()

    def test_without_its_index_the_sweep_fails_instead_of_scanning(
            self, store: MongoEventStore, now: datetime) -> None:
        key = new_key()
        claim = store.claim(key, FIELDS, now)
        store.succeed(key, claim.owner, now, [outbox_entry(key, 0, now)])
        store.collection.drop_index(OUTBOX_INDEX)
        with pytest.raises(StoreUnavailable) as raised:
            list(store.pending_outbox(now))
        assert isinstance(raised.value.__cause__, PyMongoError)
        store.ensure_indexes()
        assert len(list(store.pending_outbox(now))) == 1


class TestFromSettings:
    def test_client_is_tz_aware_times_out_and_counts_round_trips(self) -> None:
        config = Settings(mongodb_uri="mongodb://127.0.0.1:1/", mongodb_db="db", collection="c",
                          service="svc-x", store_timeout_ms=1234)
        # connects lazily: no server needed
        built = MongoEventStore.from_settings(config, count_round_trips=True)
        client = built.database.client
        try:
            options = client.options
            assert client.codec_options.tz_aware is True
            assert options.server_selection_timeout == 1.234
            assert options.pool_options.connect_timeout == 1.234
            assert options.pool_options.socket_timeout == 1.234
            assert options.pool_options.metadata["application"] == {"name": "svc-x"}
            assert isinstance(built.round_trips, RoundTrips)
            assert built.round_trips in options.event_listeners
            assert built.collection.full_name == "db.c"
            assert built.database.name == "db"
            assert built.lease == timedelta(seconds=20)
        finally:
            built.close()

    def test_every_counting_store_has_its_own_counter(self) -> None:
        config = Settings(mongodb_uri="mongodb://127.0.0.1:1/")
        first = MongoEventStore.from_settings(config, count_round_trips=True)
        second = MongoEventStore.from_settings(config, count_round_trips=True)
        try:
            assert first.round_trips is not second.round_trips
        finally:
            first.close()
            second.close()

    def test_a_store_counts_nothing_unless_asked(self) -> None:
        # A command listener makes pymongo publish two events per command: off in production.
        built = MongoEventStore.from_settings(Settings(mongodb_uri="mongodb://127.0.0.1:1/"))
        try:
            with pytest.raises(RuntimeError, match="count_round_trips=True"):
                built.round_trips.measure()
            assert built.database.client.options.event_listeners == []
        finally:
            built.close()

    def test_a_given_client_is_used_as_it_is(self, mongo_client: MongoClient) -> None:
        built = MongoEventStore.from_settings(Settings(mongodb_db="db_x"), mongo_client)
        assert built.database.client is mongo_client
        assert built.database.name == "db_x"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class TestUnavailable:
    @pytest.fixture()
    def down(self) -> Iterator[MongoEventStore]:
        config = Settings(mongodb_uri=f"mongodb://127.0.0.1:{_closed_port()}/",
                          store_timeout_ms=200)
        built = MongoEventStore.from_settings(config)
        yield built
        built.close()

    CALLS = ["claim", "succeed", "fail", "reject", "get", "ensure_indexes", "pending_outbox",
             "mark_published", "mark_publish_failed", "guard_take", "guard_finish", "guard_get",
             "summaries", "get_many", "reset"]

    @pytest.mark.parametrize("call", CALLS)
    def test_every_primitive_raises_store_unavailable_quickly(
            self, down: MongoEventStore, call: str) -> None:
        now = datetime.now(UTC)
        item = OutboxEntry("p", 0, {"idempotency_key": "p/0:A"})
        calls = {
            "claim": lambda: down.claim("k", FIELDS, now),
            "succeed": lambda: down.succeed("k", "owner", now),
            "fail": lambda: down.fail("k", "owner", now, ERROR, retryable=True),
            "reject": lambda: down.reject("k", FIELDS, now, ERROR),
            "get": lambda: down.get("k"),
            "ensure_indexes": down.ensure_indexes,
            "pending_outbox": lambda: list(down.pending_outbox(now)),
            "mark_published": lambda: down.mark_published(item, now, "m-1", 1),
            "mark_publish_failed": lambda: down.mark_publish_failed(item, now, ERROR, 1),
            "guard_take": lambda: down.guard_take("k", "owner", now, LEASE),
            "guard_finish": lambda: down.guard_finish("k", "owner", now, succeeded=True,
                                                      result={}),
            "guard_get": lambda: down.guard_get("k"),
            "summaries": lambda: down.summaries(["k"]),
            "get_many": lambda: down.get_many(["k"]),
            "reset": down.reset,
        }
        assert set(calls) == set(self.CALLS)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            calls[call]()
        assert time.monotonic() - started < 3
        assert isinstance(raised.value.__cause__, PyMongoError)


class TestBatchOutage:
    """A store outage in the middle of a batch: the whole batch is transient, nothing half-done."""

    def test_a_batch_against_a_down_store_is_unavailable(self) -> None:
        down = MongoEventStore.from_settings(Settings(
            mongodb_uri="mongodb://127.0.0.1:1/", mongodb_db="db", store_timeout_ms=300))
        now = datetime.now(UTC)
        with pytest.raises(StoreUnavailable):
            down.claim_many({new_key(): FIELDS}, now)
        with pytest.raises(StoreUnavailable):
            down.finish_many([Finish(new_key(), "owner")], now)
        with pytest.raises(StoreUnavailable):
            down.renew_many({new_key(): "owner"}, now)
        down.close()

    def test_a_claim_that_dies_before_its_read_leaves_leases_that_expire(
            self, store: MongoEventStore, shift: Shift, now: datetime) -> None:
        # The bulk claim was written, the read that follows failed: the worker
        # nacks the batch; the records are PROCESSING under a lease that
        # expires, then any worker takes them again.
        class ReadFails(_DuplicateFirst):
            def find(self, *args: Any, **kwargs: Any) -> Any:
                raise AutoReconnect("connection lost mid-batch")

        broken = MongoEventStore(ReadFails(store.collection, 0), created_by="svc",
                                 retention=timedelta(days=1), lease=LEASE)
        keys = [new_key(), new_key()]
        with pytest.raises(StoreUnavailable):
            broken.claim_many(dict.fromkeys(keys, FIELDS), now)
        later = now + LEASE + timedelta(seconds=1)
        shift.advance((LEASE + timedelta(seconds=1)).total_seconds())
        again = store.claim_many(dict.fromkeys(keys, FIELDS), later)
        assert set(again.taken) == set(keys)
        assert {claim.attempt for claim in again.taken.values()} == {2}
