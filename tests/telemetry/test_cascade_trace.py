"""A cascade is one trace: the message span, its claim/handler/finish/relay children, and the
child's message span under the relay's ``publish`` span, in-process (LocalBus) and when the
sweeper publishes the child much later. With tracing off, the trace context still travels."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eventbus import Context, Router
from eventbus.correlation.tracecontext import parse_traceparent
from eventbus.model.outcome import Outcome
from eventbus.outbox.relay import Relay
from eventbus.testing import FakeClock, LocalBus
from tests.closing import app_closed_after_test, closed_after_test
from tests.telemetry.support import Recorded, captured_lines, parent_of, recorded, trace_ids

ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "order-1",
          "entity_type": "Order"}


def cascade_router() -> Router:
    routes = Router()

    @routes.handler("ORDER")
    def on_order(context: Context) -> None:
        context.log.info("order seen")
        context.emit("STEP", {"n": 1})

    @routes.handler("STEP", internal=True)
    def on_step(context: Context) -> None:
        context.log.info("step seen")

    return routes


def traced_bus(rec: Recorded, clock: FakeClock) -> LocalBus:
    return closed_after_test(LocalBus(cascade_router(), clock=clock, telemetry=rec.telemetry))


def test_one_cascade_is_one_trace_with_the_expected_spans() -> None:
    clock = FakeClock()
    rec = recorded(clock)
    bus = traced_bus(rec, clock)
    bus.publish("ORDER", {"id": 1}, entity=ENTITY)
    assert [result.outcome for result in bus.results] == [Outcome.PROCESSED, Outcome.PROCESSED]

    spans = rec.finished()
    assert len(trace_ids(spans)) == 1
    names = sorted(span.name for span in spans)
    assert names == sorted(["message ORDER", "claim", "handler", "finish", "relay", "publish",
                            "message STEP", "claim", "handler", "finish"])
    (parent,) = rec.named("message ORDER")
    (child,) = rec.named("message STEP")
    (relay,) = rec.named("relay")
    (publish,) = rec.named("publish")
    assert parent.parent is None  # the root of the cascade
    direct = {span.name for span in spans if parent_of(span) == parent.context.span_id}
    assert direct == {"claim", "handler", "finish", "relay"}
    assert parent_of(publish) == relay.context.span_id
    assert parent_of(child) == publish.context.span_id
    assert parent.attributes["eventbus.event_type"] == "ORDER"
    assert parent.attributes["eventbus.outcome"] == "processed"
    assert parent.attributes["eventbus.attempt"] == 1
    assert child.attributes["eventbus.idempotency_key"] == bus.results[1].key
    assert parent.kind.name == child.kind.name == "CONSUMER"
    assert publish.kind.name == "PRODUCER"


def test_the_child_carries_the_publish_span_in_its_traceparent_attribute() -> None:
    clock = FakeClock()
    rec = recorded(clock)
    bus = traced_bus(rec, clock)
    bus.publish("ORDER", {"id": 1}, entity=ENTITY)
    (message,) = [m for m in bus.messages.values() if m.attributes["event_type"] == "STEP"]
    carried = parse_traceparent(message.attributes["traceparent"])
    (publish,) = rec.named("publish")
    assert carried is not None and carried.sampled
    assert int(carried.trace_id, 16) == publish.context.trace_id
    assert int(carried.span_id, 16) == publish.context.span_id


def test_a_child_the_sweeper_publishes_later_still_joins_the_parents_trace() -> None:
    clock = FakeClock()
    rec = recorded(clock)
    bus = closed_after_test(LocalBus(cascade_router(), clock=clock, telemetry=rec.telemetry))
    bus.processor.after_success = None  # the inline relay "crashed": the child waits
    bus.publish("ORDER", {"id": 1}, entity=ENTITY)
    assert len(bus.results) == 1
    (handler,) = rec.named("handler")
    (entry,) = bus.store.get(bus.results[0].key)["outbox"]
    stored = parse_traceparent(entry["traceparent"])
    assert stored is not None and int(stored.span_id, 16) == handler.context.span_id

    clock.advance(600)
    sweeper = Relay(bus.store, bus.publisher, now=clock, telemetry=rec.telemetry,
                    sleep=lambda _: None)
    assert sweeper.sweep(timedelta(seconds=60)).published == 1
    bus.drain()
    assert [result.outcome for result in bus.results] == [Outcome.PROCESSED] * 2
    spans = rec.finished()
    assert len(trace_ids(spans)) == 1
    (publish,) = rec.named("publish")
    (child,) = rec.named("message STEP")
    assert parent_of(publish) == handler.context.span_id  # the context stored at emit time
    assert parent_of(child) == publish.context.span_id


def test_with_tracing_off_the_cascade_still_shares_one_trace_id_in_its_log_lines() -> None:
    bus = closed_after_test(LocalBus(cascade_router()))
    assert bus.processor.middleware == () and bus.relay.telemetry is None
    with captured_lines() as lines:
        bus.publish("ORDER", {"id": 1}, entity=ENTITY)
    seen = [line for line in lines if line["message"] in ("order seen", "step seen")]
    assert len(seen) == 2
    traces = {line["logging.googleapis.com/trace"] for line in seen}
    assert len(traces) == 1 and next(iter(traces)).startswith("projects/proj/traces/")
    (message,) = [m for m in bus.messages.values() if m.attributes["event_type"] == "STEP"]
    carried = parse_traceparent(message.attributes["traceparent"])
    assert carried is not None
    assert next(iter(traces)) == f"projects/proj/traces/{carried.trace_id}"


def test_a_message_with_a_traceparent_attribute_continues_that_trace() -> None:
    clock = FakeClock()
    rec = recorded(clock)
    bus = traced_bus(rec, clock)
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    from eventbus.pubsub.message import build_event, build_message

    body, attributes = build_message(build_event("ORDER", {"id": 2}, entity=ENTITY))
    bus.publisher.publish_message(body, {**attributes, "traceparent": given})
    bus.drain()
    (parent,) = rec.named("message ORDER")
    assert f"{parent.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert parent.parent is not None and f"{parent.parent.span_id:016x}" == "b7ad6b7169203331"
    assert len(trace_ids(rec.finished())) == 1


@pytest.mark.parametrize(("header", "value", "trace_id"), [
    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     0x4bf92f3577b34da6a3ce929d0e0e4736),
    ("X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/1;o=1",
     0x105445aa7843bc8bf206b12000100000),
])
def test_a_push_requests_trace_header_is_read_by_the_otel_propagators(
        header: str, value: str, trace_id: int) -> None:
    import base64
    import json

    from eventbus import create_app
    from eventbus.pubsub.message import build_event
    from eventbus.settings import Settings
    from eventbus.store.memory import MemoryEventStore

    rec = recorded(FakeClock())
    routes = Router()
    routes.handler("ORDER")(lambda context: None)
    app = app_closed_after_test(create_app(routes, Settings(relay_inline=False),
                                           store=MemoryEventStore(), telemetry=rec.telemetry))
    data = json.dumps(build_event("ORDER", {}, entity=ENTITY).to_document()).encode()
    body = {"message": {"data": base64.b64encode(data).decode(), "messageId": "m-1",
                        "attributes": {"event_type": "ORDER", "event_version": "v1"}},
            "subscription": "projects/p/subscriptions/s"}
    assert app.test_client().post("/", json=body, headers={header: value}).status_code == 200
    (message,) = rec.named("message ORDER")
    assert message.context.trace_id == trace_id and message.parent is not None
    assert message.parent.is_remote
