"""The redrive primitives, and the sweeper on them, on both stores."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EventStore, Finish
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import CapturingPublisher, FakeClock
from eventbus.workers.redrive import Redriver
from tests.closing import closed_after_test
from tests.contract.conftest import ERROR, FIELDS, StoreClock, caller_clock, new_key, put_raw

AFTER = timedelta(seconds=1200)


def failed(store: EventStore, now: datetime, *, retryable: bool = True) -> str:
    key = new_key()
    claim = store.claim(key, FIELDS, now)
    assert store.fail(key, claim.owner, now, ERROR, retryable=retryable, redrive_at=now + AFTER)
    return key


def due(store: EventStore) -> set[str]:
    """The keys due for a redrive now, on the store's clock."""
    return {record["idempotency_key"] for record in store.redrivable(100)}


def seconds(span: timedelta) -> float:
    return span.total_seconds()


def test_a_retryable_failure_is_due_at_its_redrive_time(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = failed(store, now)
    final = failed(store, now, retryable=False)
    store_clock.advance(seconds(AFTER) - 1)
    assert key not in due(store)
    store_clock.advance(1)
    assert key in due(store)
    store_clock.advance(seconds(AFTER))
    assert final not in due(store)
    record = store.get(key)
    assert record is not None and record["redrive_at"] == now + AFTER
    assert "redrive_at" not in (store.get(final) or {})


def test_a_claim_clears_the_schedule(store: EventStore, store_clock: StoreClock,
                                     now: datetime) -> None:
    key = failed(store, now)
    store_clock.advance(5)
    store.claim(key, FIELDS, now + timedelta(seconds=5))
    assert "redrive_at" not in (store.get(key) or {})
    # Due again only once the new lease has expired long ago (its worker died).
    store_clock.advance(seconds(2 * store.lease) - 5)
    assert key not in due(store)
    store_clock.advance(6)
    assert key in due(store)


def test_a_processing_record_whose_lease_expired_long_ago_is_due(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = new_key()
    store.claim(key, FIELDS, now)
    store_clock.advance(seconds(store.lease) + 1)
    assert key not in due(store)
    store_clock.advance(seconds(store.lease))
    assert key in due(store)


def test_a_pending_record_is_due_at_its_redrive_time_or_at_once(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # An ordered event handed back (PENDING) is redriven like a FAILED-retryable
    # one if the broker stops delivering it.
    handed, bare = new_key(), new_key()
    claim = store.claim(handed, FIELDS, now)
    assert store.finish_many([Finish(handed, claim.owner, unclaim=True, redrive_at=now + AFTER)],
                             now).lost == frozenset()
    put_raw(store, {"idempotency_key": bare, "event_status": "PENDING"})
    assert (store.get(handed) or {})["redrive_at"] == now + AFTER
    assert bare in due(store) and handed not in due(store)
    store_clock.advance(seconds(AFTER))
    assert {handed, bare} <= due(store)


def test_mark_redriven_counts_once_and_schedules_the_next(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = failed(store, now)
    later = now + 3 * AFTER
    assert store.mark_redriven(key, 0, later) is True
    assert store.mark_redriven(key, 0, later) is False  # another sweeper was first
    record = store.get(key)
    assert record is not None and (record["redrives"], record["redrive_at"]) == (1, later)
    store_clock.advance(seconds(AFTER))
    assert key not in due(store)
    store_clock.advance(seconds(2 * AFTER))
    assert key in due(store)


def test_mark_redriven_leaves_a_live_worker_alone(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    # A PROCESSING record is redriven only once its lease ran out a lease ago;
    # a PENDING one at once.
    key, pending = new_key(), new_key()
    store.claim(key, FIELDS, now)
    put_raw(store, {"idempotency_key": pending, "event_status": "PENDING"})
    assert store.mark_redriven(key, 0, now + AFTER) is False  # its worker is alive
    store_clock.advance(seconds(store.lease) + 1)
    assert store.mark_redriven(key, 0, now + AFTER) is False  # run out, not stale yet
    assert "redrives" not in (store.get(key) or {})
    store_clock.advance(seconds(store.lease))
    assert store.mark_redriven(key, 0, now + AFTER) is True
    assert store.mark_redriven(pending, 0, now + AFTER) is True
    assert (store.get(pending) or {})["redrives"] == 1


def test_abandon_gives_up_only_a_retryable_failure_or_a_pending_record(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key, processing, pending = failed(store, now), new_key(), new_key()
    store.claim(processing, FIELDS, now)
    put_raw(store, {"idempotency_key": pending, "event_status": "PENDING"})
    error = {"type": "RedriveGivenUp", "message": "cap", "classification": "redrive_cap"}
    assert store.abandon(key, now, error) is True and store.abandon(processing, now, error) is False
    assert store.abandon(pending, now, error) is True
    for given_up in (key, pending):
        record = store.get(given_up)
        assert record is not None and record["retryable"] is False and record["error"] == error
        assert record["event_status"] == "FAILED"
    store_clock.advance(seconds(10 * AFTER))
    assert not {key, pending} & due(store)


# -- the sweeper on both stores ----------------------------------------------------------------

def flaky_router(failures: list[int]) -> Router:
    routes = Router()

    @routes.handler("TEST")
    def flaky(context: Context) -> None:
        if failures:
            failures.pop()
            raise ConnectionError("partner down")

    return routes


def event_message(key: str) -> Delivery:
    body = (b'{"event_type":"TEST","entity_metadata":{"partnerId":"p","entity_id":"e",'
            b'"entity_type":"T"},"entity_data":{"n":1}}')
    return Delivery(body, {"idempotency_key": key}, message_id=uuid.uuid4().hex)


def setup(store: EventStore, store_clock: StoreClock, failures: int,
          **settings: Any) -> tuple[Processor, Redriver, CapturingPublisher, FakeClock]:
    """A processor and a sweeper over ``store`` on one fake clock that moves the store's too."""
    clock = caller_clock(store_clock, documents.bson_time(datetime.now(UTC)))
    config = Settings(redrive_after_seconds=60, **settings)
    run = closed_after_test(Processor(store, flaky_router([1] * failures), config, clock))
    publisher = CapturingPublisher()
    return run, Redriver(store, publisher, config, now=clock, locate=run.locate), publisher, \
        clock


def test_a_stranded_retryable_event_is_published_again_and_finishes(
        store: EventStore, store_clock: StoreClock) -> None:
    run, redriver, publisher, clock = setup(store, store_clock, failures=1)
    first = run.process(event_message(uuid.uuid4().hex))
    assert first.outcome is Outcome.RETRY
    # The broker never comes back (retention ran out, the emulator stranded it).
    assert redriver.sweep().republished == 0
    clock.advance(61)
    report = redriver.sweep()
    assert report.republished == 1 and redriver.sweep().republished == 0
    [message] = publisher.take()
    again = run.process(Delivery(message.data, message.attributes, message_id="m-2"))
    assert (again.outcome, again.key) == (Outcome.PROCESSED, first.key)
    assert (store.get(first.key) or {})["event_status"] == "SUCCESS"


def test_a_republished_event_processed_before_the_sweep_returns_is_counted(
        store: EventStore, store_clock: StoreClock) -> None:
    # Push can process the republished message before the publish call returns: the
    # redrive is counted first, so the finished record still shows it.
    run, redriver, publisher, clock = setup(store, store_clock, failures=1)
    first = run.process(event_message(uuid.uuid4().hex))
    clock.advance(61)

    def deliver_at_once() -> None:
        for message in publisher.take():
            run.process(Delivery(message.data, message.attributes, message_id="m-2"))

    publisher.on_publish = deliver_at_once  # the message published before this one
    report = redriver.sweep()
    deliver_at_once()  # this sweep's message, before the sweep could mark anything
    record = store.get(first.key) or {}
    assert report.republished == 1 and report.skipped == 0
    assert (record["event_status"], record["redrives"]) == ("SUCCESS", 1)


def test_a_failed_publish_leaves_the_event_due_again_after_the_backoff(
        store: EventStore, store_clock: StoreClock) -> None:
    run, redriver, publisher, clock = setup(store, store_clock, failures=1)
    first = run.process(event_message(uuid.uuid4().hex))
    clock.advance(61)
    publisher.failures = 1
    report = redriver.sweep()
    assert (report.failed, report.republished) == (1, 0) and publisher.take() == []
    record = store.get(first.key) or {}
    assert (record["event_status"], record["retryable"]) == ("FAILED", True)
    assert redriver.sweep().republished == 0  # not due before the backoff
    clock.advance(61)
    assert redriver.sweep().republished == 1 and len(publisher.take()) == 1


def test_the_redrive_cap_gives_an_event_up_for_good(
        store: EventStore, store_clock: StoreClock) -> None:
    run, redriver, publisher, clock = setup(store, store_clock, failures=10, redrive_max=2)
    key = run.process(event_message(uuid.uuid4().hex)).key
    for _ in range(2):
        clock.advance(10_000)
        assert redriver.sweep().republished == 1
        [message] = publisher.take()
        run.process(Delivery(message.data, message.attributes, message_id=uuid.uuid4().hex))
    clock.advance(100_000)
    assert redriver.sweep().abandoned == 1
    record = store.get(key)
    assert record is not None and record["retryable"] is False
    assert record["error"]["classification"] == "redrive_cap"


def keys_of(run: Processor, publisher: CapturingPublisher) -> list[str]:
    """The record keys the published messages would be stored under."""
    return [str(run.locate(Delivery(m.data, m.attributes, message_id="x")).key)
            for m in publisher.take()]


def retryable_failure(run: Processor) -> str:
    """A key whose event failed retryably through the processor (so a sweeper can rebuild it)."""
    result = run.process(event_message(uuid.uuid4().hex))
    assert result.outcome is Outcome.RETRY
    return result.key


def test_stale_processing_records_past_the_cap_end_failed_and_never_starve_others(
        store: EventStore, store_clock: StoreClock, caplog: pytest.LogCaptureFixture) -> None:
    # Five records left PROCESSING by dead workers, whose redriven copies never
    # arrive, and more of them than one pass may act on (limit 3).
    run, redriver, publisher, clock = setup(store, store_clock, failures=6, redrive_max=1)
    stale = [retryable_failure(run) for _ in range(5)]
    for key in stale:  # taken again by a worker that then dies
        record = store.get(key) or {}
        store.claim(key, {"pubsub": record["pubsub"],
                          "payload_fingerprint": record["payload_fingerprint"]}, clock())
    clock.advance(10_000)
    assert redriver.sweep(limit=10).republished == 5  # redrive 1 of 1: the copies get lost
    publisher.take()
    waiting = retryable_failure(run)  # due after the five are due again
    clock.advance(100_000)
    caplog.set_level(logging.INFO, "eventbus.redrive")
    sweeper_log = logging.getLogger("eventbus.redrive")
    sweeper_log.addHandler(caplog.handler)  # the service's logging may stop propagation
    try:
        first, second = redriver.sweep(limit=3), redriver.sweep(limit=3)
    finally:
        sweeper_log.removeHandler(caplog.handler)
    assert "redrive pass: republished 0, abandoned 3, failed 0, skipped 0" in caplog.text
    assert (first.abandoned, first.republished) == (3, 0)
    assert (second.abandoned, second.republished) == (2, 1)
    assert keys_of(run, publisher) == [waiting]
    for key in stale:
        record = store.get(key) or {}
        assert (record["event_status"], record["retryable"]) == ("FAILED", False)
        assert record["error"]["classification"] == "redrive_cap"
        assert "left PROCESSING" in record["error"]["message"]
        assert not {"lease_owner", "lease_until", "redrive_at"} & record.keys()
    listed = {r["idempotency_key"] for r in store.find_events(EventQuery(statuses=("FAILED",)),
                                                              limit=100)}  # eventbus failed
    assert set(stale) <= listed
    assert redriver.sweep(limit=3).abandoned == 0  # nothing stays due


def test_a_live_processing_record_is_never_given_up(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    key = new_key()
    store.claim(key, FIELDS, now)
    error = {"type": "RedriveGivenUp", "message": "cap", "classification": "redrive_cap"}
    assert store.abandon(key, now, error) is False  # live
    store_clock.advance(seconds(store.lease) + 1)
    assert store.abandon(key, now, error) is False  # expired, not stale yet
    assert (store.get(key) or {})["event_status"] == "PROCESSING"
    store_clock.advance(seconds(store.lease))
    assert store.abandon(key, now, error) is True


def test_records_a_pass_cannot_act_on_do_not_starve_the_others(
        store: EventStore, store_clock: StoreClock) -> None:
    run, _, publisher, clock = setup(store, store_clock, failures=1)
    broken = [new_key() for _ in range(4)]
    for key in broken:  # records of a type this sweeper's router does not know
        store.claim(key, FIELDS, clock())
    clock.advance(10_000)
    ok = retryable_failure(run)
    clock.advance(100_000)
    redriver = Redriver(store, publisher, Settings(redrive_after_seconds=60), now=clock,
                        locate=run.locate)
    report = redriver.sweep(limit=2)
    assert (report.failed, report.republished) == (4, 1)
    assert keys_of(run, publisher) == [ok]


# -- records a rebuild made (``rebuild_made``): only a rebuild runs them -------------------------
MADE = {**FIELDS, documents.REBUILD_MADE: "rb-made"}


def test_an_unfinished_record_a_rebuild_made_is_never_due(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    """Issue 31: PENDING (its entity stayed busy) or PROCESSING (the rebuild died after its
    claim), a record a rebuild made stays out of the redrive; the same records without the
    mark are due as always."""
    pending, dead, live_pending, live_dead = (new_key() for _ in range(4))
    for key, fields in ((pending, MADE), (live_pending, FIELDS)):
        claim = store.claim(key, fields, now)
        assert store.finish_many([Finish(key, claim.owner, unclaim=True, redrive_at=now)],
                                 now).lost == frozenset()
    store.claim(dead, MADE, now)
    store.claim(live_dead, FIELDS, now)
    store_clock.advance(seconds(3 * store.lease))
    found = due(store)
    assert {live_pending, live_dead} <= found
    assert pending not in found and dead not in found
    assert (store.get(pending) or {})["event_status"] == documents.PENDING
    assert (store.get(dead) or {})[documents.REBUILD_MADE] == "rb-made"


def test_a_finished_record_a_rebuild_made_keeps_the_usual_rules(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    """The mark excludes only unfinished records: a FAILED-retryable one is due at its time."""
    key = new_key()
    claim = store.claim(key, MADE, now)
    assert store.fail(key, claim.owner, now, ERROR, retryable=True, redrive_at=now + AFTER)
    store_clock.advance(seconds(AFTER))
    assert key in due(store)


def test_a_dead_rebuild_claim_is_taken_again_only_once_its_lease_lapsed(
        store: EventStore, store_clock: StoreClock, now: datetime) -> None:
    """A resumed rebuild claims the record again through the live claim (fenced on the
    store's clock); the mark stays, and the summaries (``eventbus status``) carry it."""
    key = new_key()
    store.claim_many({key: MADE, new_key(): MADE}, now)
    early = store.claim_many({key: {**FIELDS, documents.REBUILD_MADE: "rb-other"}}, now)
    assert key not in early.taken
    store_clock.advance(seconds(store.lease) + 1)
    later = store.claim_many({key: {**FIELDS, documents.REBUILD_MADE: "rb-other"}}, now)
    assert key in later.taken and later.taken[key].attempt == 2
    record = store.get(key)
    assert record is not None and record[documents.REBUILD_MADE] == "rb-made"
    (summary,) = [s for s in store.summaries() if s["idempotency_key"] == key]
    assert summary[documents.REBUILD_MADE] == "rb-made"
    assert summary["event_status"] == documents.PROCESSING
