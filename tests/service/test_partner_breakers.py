"""One partner down, another up: the down one's events are parked and acked, the other's flow.

A test handler calls its event's partner through ``context.partner`` with a
fake call that fails while the partner is "down". Push goes through the real
Flask app, pull through the real ``PullWorker``, the redrive through the real
``Redriver`` with a capturing publisher; all on the in-memory store with a
fake clock, which is the store's clock too (breaker times are the store's).
The partner app's own client (``handlers.partners``) is checked
against a real local HTTP server at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.guard import Guard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import BreakerOpen
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.partners import Partners as PartnerGroup
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock
from eventbus.workers.pull import Inbox, PullWorker
from eventbus.workers.redrive import Redriver
from handlers.partners import PartnerClient, PartnerUnavailable
from tests.closing import closed_after_test, closed_here
from tests.hypothesis_profiles import examples
from tests.partner_server import PartnerServer
from tests.service.conftest import START, Make
from tests.service.test_pull_worker import FakeMessage


def partners_of(store: Any, settings: Settings, clock: Any) -> PartnerGroup:
    """The partners a processor built for itself before issue 41: real waits, ``clock``."""
    return PartnerGroup.beside(store, settings, now=clock, sleep=time.sleep,
                               monotonic=time.monotonic)

SETTINGS = Settings(max_attempts=5, breaker_failures=3, breaker_open_seconds=30,
                    breaker_probe_seconds=10, redrive_after_seconds=60, redrive_max=2,
                    relay_inline=False, lease_seconds=30)


class Partners:
    """Fake partners: which are down, and every call each key made."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.calls: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()

    def router(self) -> Router:
        routes = Router()

        @routes.handler("CALL")
        def call(context: Context) -> None:
            partner = context.event.entity_metadata.partner_id
            context.partner(partner).call(lambda: self.post(partner, context.key))

        return routes

    def post(self, partner: str, key: str) -> None:
        self.calls[partner] += 1
        if partner in self.down:
            raise ConnectionError(f"{partner} is down")
        self.delivered[key] += 1


def body(partner: str, n: int) -> bytes:
    return json.dumps({"event_type": "CALL", "event_version": "v1",
                       "entity_metadata": {"partnerId": partner, "entity_id": f"e-{n}",
                                           "entity_type": "Order"},
                       "entity_data": {"n": n}}).encode()


def key(partner: str, n: int) -> str:
    """The stored key: a publisher's key is scoped by its partner."""
    return f"p:{partner}:{partner}-{n}"


def delivery(partner: str, n: int) -> Delivery:
    return Delivery(body(partner, n), {"idempotency_key": f"{partner}-{n}"}, message_id=f"m-{n}")


def setup(partners: Partners) -> tuple[MemoryEventStore, Processor, Redriver,
                                       CapturingPublisher, FakeClock]:
    clock, publisher = FakeClock(START), CapturingPublisher()
    store = MemoryEventStore(clock=clock)
    run = closed_after_test(Processor(store, partners.router(), SETTINGS, clock,
                                      partners=partners_of(store, SETTINGS, clock)))
    return store, run, Redriver(store, publisher, SETTINGS, now=clock, locate=run.locate), \
        publisher, clock


def redeliver(run: Processor, publisher: CapturingPublisher) -> list[Outcome]:
    return [run.process(Delivery(message.data, message.attributes, message_id="again")).outcome
            for message in publisher.take()]


def test_push_parks_the_down_partners_events_with_200_and_the_others_flow(
        make_harness: Make) -> None:
    partners = Partners()
    partners.down.add("down")
    clock = FakeClock(START)
    harness = make_harness(partners.router(), clock=clock, store=MemoryEventStore(clock=clock),
                           breaker_failures=3)
    answers = [harness.push(json.loads(body(partner, n)), f"m-{partner}-{n}",
                            idempotency_key=f"{partner}-{n}").status_code
               for n in range(6) for partner in ("down", "up")]
    assert answers[1::2] == [200] * 6  # the healthy partner never noticed
    assert answers[0::2] == [503, 503, 200, 200, 200, 200]  # the third opens it: parked
    assert partners.calls == {"down": 3, "up": 6}
    parked = harness.store.get(key("down", 5)) or {}
    assert (parked["event_status"], parked["retryable"]) == ("FAILED", True)
    assert parked["error"]["classification"] == "parked"
    assert parked["error"]["partner"] == "down" and parked["redrive_at"] == \
        parked["error"]["until"] == START + dt.timedelta(seconds=30)
    assert harness.store.parked_counts() == {"down": 4}
    response = harness.push(json.loads(body("down", 9)), "m-9", idempotency_key="down-9")
    assert response.get_json()["outcome"] == "parked"
    assert response.get_json()["classification"] == "parked"


def test_the_redrive_brings_parked_events_back_and_each_is_delivered_once() -> None:
    partners = Partners()
    partners.down.add("down")
    store, run, redriver, publisher, clock = setup(partners)
    outcomes = [run.process(delivery("down", n)).outcome for n in range(8)]
    assert outcomes.count(Outcome.PARKED) == 6 and partners.calls["down"] == 3
    for _ in range(4):  # four reopenings while it stays down: probes only, nothing given up
        clock.advance(130)
        redriver.sweep()
        redeliver(run, publisher)
    assert 3 < partners.calls["down"] <= 3 + 4  # the failures, then probes only
    partners.down.clear()
    for _ in range(6):
        clock.advance(130)
        redriver.sweep()
        redeliver(run, publisher)
    assert all((store.get(key("down", n)) or {})["event_status"] == "SUCCESS" for n in range(8))
    assert partners.delivered == {key("down", n): 1 for n in range(8)}


def test_a_parked_event_spends_no_attempt() -> None:
    partners = Partners()
    partners.down.add("down")
    store, run, _redriver, _publisher, clock = setup(partners)
    for n in range(3):
        run.process(delivery("down", n))
    for _ in range(8):  # eight parks, past the cap of five attempts
        assert run.process(delivery("down", 9)).outcome is Outcome.PARKED
    assert (store.get(key("down", 9)) or {})["attempts"] == 8
    partners.down.clear()
    clock.advance(31)
    result = run.process(delivery("down", 9))
    assert result.outcome is Outcome.PROCESSED and result.attempt == 9


def test_the_pull_worker_acks_parked_events_and_processes_the_others() -> None:
    partners = Partners()
    partners.down.add("down")
    _store, run, *_ = setup(partners)
    worker = PullWorker(run, Inbox(), subscription="projects/p/subscriptions/s-pull",
                        batch_size=100)
    first = [FakeMessage(body("down", n), {"idempotency_key": f"down-{n}"}, f"m-{n}")
             for n in range(3)]
    worker.run_batch(first)
    assert [m.answer for m in first] == ["nack", "nack", "ack"]
    batch = [FakeMessage(body(partner, n), {"idempotency_key": f"{partner}-{n}"},
                         f"m-{partner}-{n}") for n in range(3, 9) for partner in ("down", "up")]
    results = worker.run_batch(batch)
    assert [m.answer for m in batch] == ["ack"] * 12
    assert [r.outcome for r in results[0::2]] == [Outcome.PARKED] * 6
    assert [r.outcome for r in results[1::2]] == [Outcome.PROCESSED] * 6
    assert partners.calls == {"down": 3, "up": 6}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=2000) | st.sampled_from(["\ud800", "a\x00b", "x" * 100_000, "", " "]))
def test_any_partner_name_from_a_message_parks_safely(name: str) -> None:
    partners = Partners()
    partners.down.add(name)
    clock = FakeClock(START)
    store = MemoryEventStore(clock=clock)
    routes = Router()

    @routes.handler("CALL")
    def call(context: Context) -> None:
        context.partner(name).call(lambda: partners.post(name, context.key))

    group = partners_of(store, SETTINGS, clock)
    with closed_here(Processor(store, routes, SETTINGS, clock,
                               partners=group)) as run:  # one an example
        outcomes = [run.process(delivery("p", n)).outcome for n in range(5)]
    assert outcomes == [Outcome.RETRY] * 2 + [Outcome.PARKED] * 3
    [stored_name] = store.parked_counts()
    assert stored_name.isprintable() and len(stored_name) <= 100


def test_the_partner_apps_client_stops_calling_a_down_partner() -> None:
    clock = FakeClock(START)
    store = MemoryEventStore(clock=clock)
    group = partners_of(store, SETTINGS, clock)
    with PartnerServer(then=503) as server:
        client = PartnerClient(Guard(store, lease=dt.timedelta(seconds=30), now=clock),
                               timeout=2.0, partner=group.get("acme"))
        failures: list[Any] = []
        for n in range(5):
            try:
                client.deliver(f"k-{n}", server.template.format(partnerId="acme"), {"n": n})
            except (PartnerUnavailable, BreakerOpen) as exc:
                failures.append(type(exc))
        assert failures == [PartnerUnavailable] * 2 + [BreakerOpen] * 3
        assert len(server.calls) == 3
        assert (store.guard_get("k-4") or {})["status"] == "FAILED"  # lease released


def test_a_redrive_pass_sends_a_paused_partner_one_probe_and_a_closed_one_everything() -> None:
    partners = Partners()
    partners.down.add("down")
    _store, run, redriver, publisher, clock = setup(partners)
    for n in range(8):
        run.process(delivery("down", n))  # two failures open it; six parked
    clock.advance(31)
    report = redriver.sweep()
    assert report.republished == 1 and report.waiting >= 5  # one probe, the rest wait
    assert redeliver(run, publisher) == [Outcome.PARKED]  # the probe failed: open again
    assert redriver.sweep().republished == 0  # open: nothing goes
    partners.down.clear()
    clock.advance(61)
    # The next probe, and the two that failed before it opened (nacked, not parked).
    assert redriver.sweep().republished == 3
    assert redeliver(run, publisher) == [Outcome.PROCESSED] * 3  # it answers: closed, unparked
    assert redriver.sweep().republished == 5
    assert redeliver(run, publisher) == [Outcome.PROCESSED] * 5
    assert partners.delivered == {key("down", n): 1 for n in range(8)}
