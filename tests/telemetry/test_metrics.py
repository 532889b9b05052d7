"""The counters move by the expected amounts: outcomes by type, handler and end-to-end latency,
attempts per event, the oldest pending outbox entry; and the Prometheus page shows them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from eventbus import Context, PermanentError, Router, TransientError, create_app
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.partners import gauges
from eventbus.pubsub.message import build_event, build_message
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock, LocalBus
from tests.closing import app_closed_after_test, closed_after_test
from tests.partner_stores import beside
from tests.telemetry.support import Recorded, recorded

ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "e-1",
          "entity_type": "Order"}


class Handlers:
    """OK (takes 2 s of fake time), FLAKY (fails once), BAD (fails for good until fixed)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.flaky_calls, self.fixed = clock, 0, False

    def router(self) -> Router:
        routes = Router()
        routes.handler("OK")(self.ok)
        routes.handler("FLAKY")(self.flaky)
        routes.handler("BAD")(self.bad)
        routes.handler("PARENT")(lambda context: context.emit("CHILD", {}))
        routes.handler("CHILD", internal=True)(lambda context: None)
        return routes

    def ok(self, context: Context) -> None:
        self.clock.advance(2)

    def flaky(self, context: Context) -> None:
        self.flaky_calls += 1
        if self.flaky_calls == 1:
            raise TransientError("try again")

    def bad(self, context: Context) -> None:
        if not self.fixed:
            raise PermanentError("never")


def metered_bus(tracing: bool) -> tuple[LocalBus, Recorded, Handlers]:
    clock = FakeClock()
    handlers = Handlers(clock)
    rec = recorded(clock, tracing=tracing)
    bus = closed_after_test(LocalBus(handlers.router(), clock=clock, telemetry=rec.telemetry))
    return bus, rec, handlers


def hold_lease_on(bus: LocalBus, data: dict[str, Any]) -> None:
    """Claim the record another worker would hold, so the delivery finds it IN_PROGRESS."""
    body, attributes = build_message(build_event("OK", data, entity=ENTITY))
    located = bus.processor.locate(Delivery(data=body, attributes=attributes))
    bus.store.claim(located.key, located.fields, bus.clock())
    bus.publisher.publish_message(body, attributes)
    assert bus.drain()[0].outcome is Outcome.IN_PROGRESS


@pytest.mark.parametrize("tracing", [True, False], ids=["traced", "metrics-only"])
def test_the_counters_move_by_the_expected_amounts(tracing: bool) -> None:
    bus, rec, handlers = metered_bus(tracing)
    ok = bus.publish("OK", {"n": 1}, entity=ENTITY)
    bus.publish("OK", {"n": 1}, entity=ENTITY)  # the same event again
    hold_lease_on(bus, {"n": 2})
    flaky = bus.publish("FLAKY", {}, entity=ENTITY)
    bus.redeliver(flaky)
    bad = bus.publish("BAD", {}, entity=ENTITY)
    bus.publish_raw(b"not json at all", {})
    bus.store.record_replay(bad, {"by": "operator", "reason": "fixed"}, bus.clock(),
                            reopen=True)
    handlers.fixed = True
    assert bus.redeliver(bad).outcome is Outcome.PROCESSED

    assert rec.events() == {
        ("OK", "processed"): 1, ("OK", "duplicate"): 1, ("OK", "in_progress"): 1,
        ("FLAKY", "retry"): 1, ("FLAKY", "processed"): 1,
        ("BAD", "rejected"): 1, ("BAD", "replayed"): 1,
        ("(unrouted)", "rejected"): 1,
    }
    assert bus.record(ok)["event_status"] == "SUCCESS"

    attempts = {p.attributes["eventbus.event_type"]: (p.count, p.sum)
                for p in rec.points("eventbus.event.attempts")}
    assert attempts == {"OK": (1, 1), "FLAKY": (1, 2), "BAD": (2, 1 + 2)}
    handler = {(point.attributes["eventbus.event_type"], point.attributes.get("error.type")):
               point.count for point in rec.points("messaging.process.duration")}
    assert handler == {("OK", None): 1, ("FLAKY", "TransientError"): 1, ("FLAKY", None): 1,
                       ("BAD", "PermanentError"): 1, ("BAD", None): 1}
    end_to_end = {(p.attributes["eventbus.event_type"], p.attributes["eventbus.outcome"]):
                  (p.count, p.sum)
                  for p in rec.points("eventbus.event.end_to_end")}
    assert end_to_end[("OK", "processed")] == (1, 2.0)  # publishTime to the finish
    assert set(end_to_end) == {("OK", "processed"), ("FLAKY", "processed"),
                               ("BAD", "rejected"), ("BAD", "replayed"),
                               ("(unrouted)", "rejected")}


def test_the_oldest_pending_outbox_entry_is_a_gauge() -> None:
    bus, rec, _ = metered_bus(tracing=False)
    rec.telemetry.watch_outbox(bus.store)
    assert [point.value for point in rec.points("eventbus.outbox.oldest_pending_age")] == [0.0]
    bus.processor.after_success = None  # children wait for the sweeper
    bus.publish("PARENT", {}, entity=ENTITY)
    bus.clock.advance(30)
    bus.publish("PARENT", {"second": True}, entity=ENTITY)
    bus.clock.advance(15)
    (age,) = rec.points("eventbus.outbox.oldest_pending_age")
    assert age.value == 45.0


def test_a_store_that_cannot_answer_reports_no_outbox_age() -> None:
    class Down:
        def oldest_pending_outbox(self) -> None:
            raise OSError("down")

    _, rec, _ = metered_bus(tracing=False)
    rec.telemetry.watch_outbox(Down())
    assert rec.points("eventbus.outbox.oldest_pending_age") == []


def test_the_prometheus_page_shows_the_counters() -> None:
    settings = Settings(metrics_exporter="prometheus", relay_inline=False)
    routes = Router()
    routes.handler("OK")(lambda context: None)
    app = app_closed_after_test(create_app(routes, settings, store=MemoryEventStore()))
    client = app.test_client()
    data = json.dumps(build_event("OK", {}, entity=ENTITY).to_document()).encode()
    body = {"message": {"data": base64.b64encode(data).decode(), "messageId": "m-1",
                        "publishTime": "2026-11-22T10:00:00.123456789Z",
                        "attributes": {"event_type": "OK", "event_version": "v1"}},
            "subscription": "projects/p/subscriptions/s"}
    for _ in range(2):
        assert client.post("/", json=body).status_code == 200
    page = client.get("/metrics")
    assert page.status_code == 200 and page.content_type.startswith("text/plain")
    text = page.get_data(as_text=True)
    counted = {line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line.startswith("messaging_client_consumed_messages_total{")
               and 'eventbus_event_type="OK"' in line}
    assert counted == {"1.0"}
    assert sum('messaging_client_consumed_messages_total{' in line
               and f'eventbus_outcome="{outcome}"' in line
               for line in text.splitlines() for outcome in ("processed", "duplicate")) == 2
    assert "messaging_process_duration_seconds_bucket" in text
    assert "eventbus_outbox_oldest_pending_age_seconds" in text
    app.extensions["eventbus"].telemetry.shutdown()


def test_without_prometheus_there_is_no_metrics_page() -> None:
    app = app_closed_after_test(create_app(Router(), Settings(relay_inline=False),
                                           store=MemoryEventStore()))
    assert app.test_client().get("/metrics").status_code == 404


def test_the_views_give_each_histogram_its_bucket_bounds() -> None:
    from eventbus.telemetry.providers import BUCKETS

    bus, rec, _ = metered_bus(tracing=False)
    bus.publish("OK", {}, entity=ENTITY)
    for name, bounds in BUCKETS.items():
        (point,) = rec.points(name)
        assert tuple(point.explicit_bounds) == tuple(float(bound) for bound in bounds)


def test_breakers_and_parked_events_are_gauges_per_partner() -> None:
    from eventbus.model.errors import TransientError
    from eventbus.partners import Partners
    from eventbus.settings import Settings

    bus, rec, _ = metered_bus(tracing=False)
    rec.telemetry.observe(gauges.watching(beside(bus.store)))
    group = Partners.beside(bus.store, Settings(breaker_failures=2), now=bus.clock)

    def down() -> None:
        raise TransientError("503")

    for name, failures in (("acme", 2), ("globex", 1)):
        for _ in range(failures):
            with pytest.raises(TransientError):
                group.get(name).call(down)
    bus.clock.advance(45)
    states = {p.attributes["eventbus.partner"]: p.value
              for p in rec.points("eventbus.partner.breaker_state")}
    open_for = {p.attributes["eventbus.partner"]: p.value
                for p in rec.points("eventbus.partner.open_for")}
    assert states == {"acme": 2, "globex": 0} and open_for == {"acme": 45.0, "globex": 0.0}
    assert rec.points("eventbus.partner.parked") == []


def test_a_store_that_cannot_answer_reports_no_partner_gauges() -> None:
    class Down:
        def breakers(self) -> None:
            raise OSError("down")

        def parked_counts(self) -> None:
            raise OSError("down")

    _, rec, _ = metered_bus(tracing=False)
    rec.telemetry.observe(gauges.watching(Down()))
    assert rec.points("eventbus.partner.breaker_state") == []
    assert rec.points("eventbus.partner.parked") == []
