"""Bulkheads on both stores: a cap per partner per process, parked over it, never a 503.

The cap is held in this process (``eventbus.partners.bulkhead``), but what an event
over it becomes is stored: FAILED-retryable, parked with the partner named,
``redrive_at`` on the store's clock, brought back by the store-driven
redrive. So each test runs against the in-memory store and the real server.
The fake partner counts its calls in flight itself: the cap is what it saw.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import BulkheadFull
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.partners import Partners
from eventbus.partners import documents as partner_documents
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.testing import CapturingPublisher
from eventbus.workers.redrive import Redriver
from tests.closing import closed_after_test
from tests.contract.conftest import StoreClock, caller_clock


def partners_of(store: Any, settings: Settings, clock: Any) -> Partners:
    """The partners a processor built for itself before issue 41: real waits, ``clock``."""
    return Partners.beside(store, settings, now=clock, sleep=time.sleep, monotonic=time.monotonic)

PARK = 5.0


class FakePartner:
    """Counts its calls in flight (the most at once, per partner) and every key it was sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.flying: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.gate = threading.Event()
        self.gate.set()

    def post(self, partner: str, key: str) -> None:
        with self.lock:
            self.flying[partner] += 1
            self.most[partner] = max(self.most[partner], self.flying[partner])
        try:
            assert self.gate.wait(10), "the test never opened the gate"
        finally:
            with self.lock:
                self.flying[partner] -= 1
                self.sent[key] += 1


def router(partner: FakePartner) -> Router:
    routes = Router()

    @routes.handler("CALL")
    def call(context: Context) -> None:
        name = context.event.entity_metadata.partner_id
        context.partner(name).call(lambda: partner.post(name, context.key))

    return routes


def delivery(partner: str, tag: str) -> Delivery:
    body = json.dumps({"event_type": "CALL", "entity_data": {},
                       "entity_metadata": {"partnerId": partner, "entity_id": "e",
                                           "entity_type": "T"}}).encode()
    return Delivery(body, {"idempotency_key": tag}, message_id=uuid.uuid4().hex)


def test_never_more_than_the_cap_in_flight_under_threads_and_other_partners_go_at_once(
        store: EventStore) -> None:
    partner = FakePartner()
    group = Partners.beside(store, Settings(partner_concurrency=3,
                                     partner_concurrency_wait_seconds=8.0))
    partner.gate.clear()
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(group.get("acme").call,
                               lambda n=n: partner.post("acme", f"a-{n}")) for n in range(12)]
        # Wait (bounded) until three hold their slots, the others queued behind them.
        for _ in range(2000):
            if partner.flying["acme"] == 3:
                break
            threading.Event().wait(0.005)
        assert partner.flying["acme"] == 3
        assert group.in_flight()["acme"] == 3
        # acme's bulkhead is full and waiting: another partner's call is not behind it.
        other = threading.Thread(target=group.get("globex").call,
                                 args=(lambda: partner.sent.update(["g-1"]),))
        other.start()
        other.join(5)
        assert partner.sent["g-1"] == 1
        partner.gate.set()
        for future in futures:
            future.result(timeout=20)
    assert partner.most["acme"] == 3  # the cap, reached and never passed
    assert sum(partner.sent[f"a-{n}"] for n in range(12)) == 12
    assert group.in_flight()["acme"] == 0


def test_a_cap_of_one_and_no_wait_refuses_the_second_at_once(store: EventStore) -> None:
    group = Partners.beside(store, Settings(partner_concurrency=1,
                                            partner_concurrency_wait_seconds=0,
                                            partner_concurrency_park_seconds=PARK))
    with group.slot("acme"), pytest.raises(BulkheadFull) as full:
        group.get("acme").call(lambda: pytest.fail("called over the cap"))
    assert full.value.partner == "acme"
    assert (full.value.until - store.now()).total_seconds() == pytest.approx(PARK, abs=1)
    assert group.get("acme").call(lambda: 7) == 7  # free again


def test_a_partners_own_cap_overrides_and_zero_lifts_it(store: EventStore) -> None:
    group = Partners.beside(store, Settings(partner_concurrency=1,
                                            partner_concurrency_wait_seconds=0,
                                            partner_concurrencies=(("free", 0), ("two", 2))))
    assert (group.concurrency("acme"), group.concurrency("free"), group.concurrency("two")) \
        == (1, 0, 2)
    with group.slot("free"), group.slot("free"), group.slot("free"):
        assert group.in_flight()["free"] == 3
    with group.slot("two"), group.slot("two"), pytest.raises(BulkheadFull):
        group.get("two").call(lambda: None)


def _setup(store: EventStore, store_clock: StoreClock,
           partner: FakePartner) -> tuple[Processor, Redriver, CapturingPublisher, Any]:
    clock = caller_clock(store_clock, documents.bson_time(datetime.now(UTC)))
    config = Settings(partner_concurrency=1, partner_concurrency_wait_seconds=0,
                      partner_concurrency_park_seconds=PARK, redrive_after_seconds=60,
                      relay_inline=False)
    run = closed_after_test(Processor(store, router(partner), config, clock,
                                      partners=partners_of(store, config, clock)))
    publisher = CapturingPublisher()
    return run, Redriver(store, publisher, config, now=clock, locate=run.locate), publisher, \
        clock


def test_over_the_cap_an_event_is_parked_acked_and_comes_back_once_through_the_redrive(
        store: EventStore, store_clock: StoreClock) -> None:
    partner = FakePartner()
    run, redriver, publisher, clock = _setup(store, store_clock, partner)
    tag = uuid.uuid4().hex
    with run.partners.slot("acme"):  # another call of acme holds its only slot
        over = run.process(delivery("acme", f"{tag}-1"))
        beside = run.process(delivery("globex", f"{tag}-2"))
    assert over.outcome is Outcome.PARKED and over.outcome.acked  # 200, never a 503
    assert beside.outcome is Outcome.PROCESSED  # another partner is not held by it
    record = store.get(over.key) or {}
    assert (record["event_status"], record["retryable"]) == ("FAILED", True)
    assert record["error"]["classification"] == partner_documents.PARKED
    assert (record["error"]["partner"], record["error"]["type"]) == ("acme", "BulkheadFull")
    assert record["redrive_at"] == record["error"]["until"]
    assert store.parked_counts() == {"acme": 1}
    assert partner.sent[over.key] == 0
    assert redriver.sweep().republished == 0  # not before its time
    clock.advance(PARK + 1)
    assert redriver.sweep().republished == 1
    [message] = publisher.take()
    again = run.process(Delivery(message.data, message.attributes, message_id="m-again"))
    assert (again.outcome, again.key) == (Outcome.PROCESSED, over.key)
    assert partner.sent[over.key] == 1
    assert (store.get(over.key) or {})["event_status"] == "SUCCESS"
    clock.advance(3600)
    assert redriver.sweep().republished == 0 and store.parked_counts() == {}
    assert partner.sent[over.key] == 1  # once


def test_a_batch_over_the_cap_parks_the_rest_and_calls_the_others(
        store: EventStore, store_clock: StoreClock) -> None:
    partner = FakePartner()
    clock = caller_clock(store_clock, documents.bson_time(datetime.now(UTC)))
    config = Settings(partner_concurrency=2, partner_concurrency_wait_seconds=0,
                      relay_inline=False)
    run = closed_after_test(Processor(store, router(partner), config, clock, concurrency=8,
                                      partners=partners_of(store, config, clock)))
    tag = uuid.uuid4().hex
    partner.gate.clear()
    batch = [delivery("acme", f"{tag}-a{n}") for n in range(6)] + \
        [delivery("globex", f"{tag}-g{n}") for n in range(2)]
    # The gate opens once globex's two calls went: acme's holders wait for them.
    opener = threading.Thread(target=_open_when, args=(partner, tag))
    opener.start()
    results = run.run(batch)
    opener.join(10)
    run.close()
    by_partner = Counter((r.key.split(":")[1], r.outcome) for r in results)
    assert partner.most["acme"] <= 2
    assert by_partner[("globex", Outcome.PROCESSED)] == 2
    assert by_partner[("acme", Outcome.PROCESSED)] + by_partner[("acme", Outcome.PARKED)] == 6
    assert all(r.outcome is not Outcome.RETRY for r in results)


def _open_when(partner: FakePartner, tag: str) -> None:
    for _ in range(2000):
        with partner.lock:
            if partner.flying["globex"] + sum(n for k, n in partner.sent.items()
                                               if "-g" in k) >= 2:
                break
        threading.Event().wait(0.005)
    partner.gate.set()
