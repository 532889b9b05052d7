"""The operator primitives (``eventbus.store.operator_queries``) on both stores.

Seed 002's queries ("Failed Events for Retry", "Partner Event History"),
counts for the overview, the replay audit and the dead-letter record: every
test states one expectation, and ``MemoryEventStore`` and ``MongoEventStore``
must both meet it.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import Any

import pytest

from eventbus.model.errors import AlreadyExists
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.store.documents import FAILED, PROCESSING, SUCCESS
from eventbus.store.operator_queries import Count, EventQuery, OperatorStore
from tests.contract.conftest import ERROR, FIELDS, new_key, put_raw

HOUR = timedelta(hours=1)
PERMANENT = {"type": "PermanentError", "message": "no such order", "classification": "permanent"}


def fields(event_type: str = "OR_MGMT", partner: str = "p-1") -> dict[str, Any]:
    meta = {**FIELDS["entity_metadata"], "partnerId": partner}
    return {**FIELDS, "event_type": event_type, "entity_metadata": meta}


def failed(store: Any, at: datetime, *, attempts: int = 1, retryable: bool = False,
           error: dict[str, Any] = PERMANENT, **kinds: str) -> str:
    """A record FAILED after ``attempts`` attempts one second apart; the last says ``retryable``."""
    key = new_key()
    for number in range(attempts):
        moment = at + timedelta(seconds=number)
        claim = store.claim(key, fields(**kinds), moment)
        last = number == attempts - 1
        assert store.fail(key, claim.owner, moment, error if last else ERROR,
                          retryable=retryable or not last)
    return key


def succeeded(store: Any, at: datetime, **kinds: str) -> str:
    key = new_key()
    claim = store.claim(key, fields(**kinds), at)
    assert store.succeed(key, claim.owner, at)
    return key


def keys(records: list[dict[str, Any]]) -> list[str]:
    return [record["idempotency_key"] for record in records]


class TestProtocol:
    def test_every_operator_primitive_is_implemented_with_its_signature(
            self, store: EventStore) -> None:
        members = [name for name in vars(OperatorStore) if not name.startswith("_")]
        assert {"find_events", "count_events", "record_replay", "store_dead_letter"} <= set(
            members)
        for name in members:
            wanted = list(inspect.signature(getattr(OperatorStore, name)).parameters)[1:]
            assert list(inspect.signature(getattr(store, name)).parameters) == wanted, name


class TestFindEvents:
    def test_seed_failed_events_for_retry_is_failed_without_the_fifth_attempt(
            self, store: Any, now: datetime) -> None:
        young = failed(store, now - HOUR, attempts=2, retryable=True)
        capped = failed(store, now - 2 * HOUR, attempts=5, retryable=True)
        succeeded(store, now)
        query = EventQuery(statuses=(FAILED,), below_attempt=5)
        assert keys(store.find_events(query, limit=10)) == [young]
        everything = store.find_events(EventQuery(statuses=(FAILED,)), limit=10)
        assert keys(everything) == [young, capped]

    def test_partner_history_is_newest_first_and_limited(self, store: Any,
                                                         now: datetime) -> None:
        mine = [succeeded(store, now - n * HOUR, partner="p-9") for n in range(4)]
        succeeded(store, now, partner="p-other")
        query = EventQuery(partner_id="p-9")
        assert keys(store.find_events(query, limit=100)) == mine
        assert keys(store.find_events(query, limit=2)) == mine[:2]
        assert store.find_events(query, limit=0) == []

    def test_filters_by_type_retryable_and_time(self, store: Any, now: datetime) -> None:
        final = failed(store, now - 3 * HOUR, event_type="SUB_MGMT")
        retrying = failed(store, now - HOUR, event_type="SUB_MGMT", retryable=True)
        failed(store, now - HOUR, event_type="OR_MGMT")
        by_type = EventQuery(statuses=(FAILED,), event_type="SUB_MGMT")
        assert keys(store.find_events(by_type, limit=10)) == [retrying, final]
        assert keys(store.find_events(EventQuery(event_type="SUB_MGMT", retryable=False),
                                      limit=10)) == [final]
        assert keys(store.find_events(EventQuery(event_type="SUB_MGMT", retryable=True),
                                      limit=10)) == [retrying]
        window = EventQuery(event_type="SUB_MGMT", since=now - 2 * HOUR)
        assert keys(store.find_events(window, limit=10)) == [retrying]
        before = EventQuery(event_type="SUB_MGMT", until=now - 2 * HOUR)
        assert keys(store.find_events(before, limit=10)) == [final]

    def test_min_attempts_and_the_attempts_order(self, store: Any, now: datetime) -> None:
        once = failed(store, now - HOUR, retryable=True)
        thrice = failed(store, now - 3 * HOUR, attempts=3, retryable=True)
        twice = failed(store, now - 2 * HOUR, attempts=2, retryable=True)
        assert keys(store.find_events(EventQuery(min_attempts=2), limit=10)) == [twice, thrice]
        ordered = store.find_events(EventQuery(), limit=10, order="attempts")
        assert keys(ordered) == [thrice, twice, once]

    def test_fields_project_top_level_names_and_no_server_id(self, store: Any,
                                                            now: datetime) -> None:
        key = failed(store, now)
        (full,) = store.find_events(EventQuery(), limit=1)
        assert "_id" not in full and full["error"] == PERMANENT
        assert full["entity_metadata"]["resilienceAttemptCount"] == {
            "1": documents.epoch_ms(now)}
        (some,) = store.find_events(EventQuery(), limit=1,
                                    fields=("idempotency_key", "error", "nope"))
        assert some == {"idempotency_key": key, "error": PERMANENT}

    def test_a_record_without_created_matches_no_time_window(self, store: Any,
                                                             now: datetime) -> None:
        put_raw(store, {"idempotency_key": "odd", "event_status": FAILED})
        assert keys(store.find_events(EventQuery(statuses=(FAILED,)), limit=5)) == ["odd"]
        assert store.find_events(EventQuery(since=now - HOUR), limit=5) == []

    def test_dead_lettered_filter(self, store: Any, now: datetime) -> None:
        plain = failed(store, now)
        marked = failed(store, now - HOUR)
        store.store_dead_letter(marked, fields(), now, PERMANENT, {"messageId": "m"})
        assert keys(store.find_events(EventQuery(dead_lettered=True), limit=5)) == [marked]
        assert keys(store.find_events(EventQuery(dead_lettered=False), limit=5)) == [plain]


class TestCountEvents:
    def test_counts_by_type_and_status(self, store: Any, now: datetime) -> None:
        failed(store, now)
        failed(store, now, retryable=True)
        succeeded(store, now)
        succeeded(store, now, event_type="SUB_MGMT", partner="p-2")
        counts = store.count_events(EventQuery(), ["event_type", "event_status"])
        assert sorted((c.values, c.count) for c in counts) == [
            (("OR_MGMT", FAILED), 2), (("OR_MGMT", SUCCESS), 1), (("SUB_MGMT", SUCCESS), 1)]
        by_partner = store.count_events(EventQuery(statuses=(SUCCESS,)),
                                        ["entity_metadata.partnerId"])
        assert sorted((c.values, c.count) for c in by_partner) == [(("p-1",), 1), (("p-2",), 1)]
        assert all(c.bucket is None for c in counts)

    def test_buckets_of_created(self, store: Any, now: datetime) -> None:
        start = datetime.fromtimestamp(
            (int(documents.epoch_ms(now)) // 3_600_000 - 3) * 3600, now.tzinfo)
        failed(store, start + timedelta(minutes=5))
        succeeded(store, start + timedelta(minutes=10))
        succeeded(store, start + HOUR + timedelta(minutes=1))
        counts = store.count_events(EventQuery(since=start), ["event_status"],
                                    bucket_ms=3_600_000)
        first = int(documents.epoch_ms(start))
        assert sorted(counts, key=lambda c: (c.bucket, c.values)) == [
            Count((FAILED,), 1, first), Count((SUCCESS,), 1, first),
            Count((SUCCESS,), 1, first + 3_600_000)]

    def test_a_missing_field_counts_as_none(self, store: Any, now: datetime) -> None:
        put_raw(store, {"idempotency_key": "bare", "event_status": FAILED})
        (count,) = store.count_events(EventQuery(), ["event_type", "event_status"])
        assert (count.values, count.count) == ((None, FAILED), 1)


class TestRecordReplay:
    def test_reopening_makes_a_final_failure_claimable_with_an_audit_entry(
            self, store: Any, now: datetime) -> None:
        key = failed(store, now, attempts=3)
        entry = {"by": "ops@example.com", "at": now, "why": "partner fixed"}
        later = now + HOUR
        after = store.record_replay(key, entry, later, reopen=True)
        assert after is not None and after == store.get(key)
        assert after["event_status"] == FAILED and after["retryable"] is True
        assert after["replayed_at_attempt"] == 3 and after["replays"] == [entry]
        assert after["error"] == PERMANENT
        assert after["lastUpdatedTime"] == documents.epoch_ms(later)
        claim = store.claim(key, fields(), later)
        assert claim.attempt == 4

    def test_a_reopened_record_is_due_for_the_redrive_with_a_fresh_budget(
            self, store: Any, now: datetime) -> None:
        key = failed(store, now, attempts=3)
        store.mark_redriven(key, 0, now)  # one redrive spent before the replay
        due = store.now() + HOUR
        after = store.record_replay(key, {"by": "a"}, now, reopen=True, redrive_at=due)
        assert after is not None and after["redrive_at"] == documents.bson_time(due)
        assert after["redrives"] == 0  # no parks: the budget starts again
        assert key not in {r["idempotency_key"] for r in store.redrivable(10)}
        assert store.record_replay(key, {"by": "b"}, now, reopen=False) is not None
        assert (store.get(key) or {})["redrive_at"] == documents.bson_time(due)

    def test_entries_accumulate_in_order(self, store: Any, now: datetime) -> None:
        key = failed(store, now)
        store.record_replay(key, {"by": "a", "at": now, "why": "one"}, now, reopen=True)
        after = store.record_replay(key, {"by": "b", "at": now, "why": "two",
                                          "data": {"new_key": "k2"}}, now, reopen=False)
        assert after is not None
        assert [entry["by"] for entry in after["replays"]] == ["a", "b"]
        assert after["replays"][1]["data"] == {"new_key": "k2"}

    @pytest.mark.parametrize("status", [SUCCESS, PROCESSING])
    def test_reopening_what_is_not_failed_changes_nothing(
            self, store: Any, now: datetime, status: str) -> None:
        key = succeeded(store, now) if status == SUCCESS else new_key()
        if status == PROCESSING:
            store.claim(key, fields(), now)
        before = store.get(key)
        with pytest.raises(AlreadyExists) as raised:
            store.record_replay(key, {"by": "a"}, now, reopen=True)
        assert raised.value.record["event_status"] == status
        assert store.get(key) == before

    def test_an_audit_entry_alone_goes_on_any_record(self, store: Any, now: datetime) -> None:
        key = succeeded(store, now)
        after = store.record_replay(key, {"by": "a"}, now, reopen=False)
        assert after is not None and after["event_status"] == SUCCESS
        assert after["replays"] == [{"by": "a"}] and "replayed_at_attempt" not in after

    def test_an_unknown_key_is_none(self, store: Any, now: datetime) -> None:
        assert store.record_replay("nope", {"by": "a"}, now, reopen=True) is None
        assert store.record_replay("nope", {"by": "a"}, now, reopen=False) is None
        assert store.get("nope") is None


class TestStoreDeadLetter:
    MARK = {"subscription": "projects/p/subscriptions/dlq-pull", "messageId": "m-9"}

    def test_a_new_key_is_stored_failed_for_good_with_the_mark(
            self, store: Any, now: datetime) -> None:
        key = new_key()
        error = {"type": "DeadLettered", "message": "gave up", "classification": "attempt_cap"}
        mark = {**self.MARK, "at": now}
        assert store.store_dead_letter(key, fields(), now, error, mark, raw_payload="{}") \
            == "stored"
        record = store.get(key)
        assert record is not None
        assert (record["event_status"], record["retryable"], record["error"]) == (
            FAILED, False, error)
        assert record["dead_lettered"] == mark and record["raw_payload"] == "{}"
        assert record["entity_metadata"]["partnerId"] == "p-1"
        assert record["created"] == documents.epoch_ms(now) and record["attempts"] == 0

    def test_an_existing_record_is_only_marked(self, store: Any, now: datetime) -> None:
        key = failed(store, now, retryable=True)
        before = store.get(key)
        assert before is not None
        assert store.store_dead_letter(key, fields(), now, PERMANENT, self.MARK) == "marked"
        after = store.get(key)
        assert after is not None and after["dead_lettered"] == self.MARK
        assert {k: v for k, v in after.items() if k != "dead_lettered"} == before
        again = {**self.MARK, "messageId": "m-10"}
        assert store.store_dead_letter(key, fields(), now, PERMANENT, again) == "marked"
        stored = store.get(key)
        assert stored is not None and stored["dead_lettered"] == again
