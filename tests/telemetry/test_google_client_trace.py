"""Google's client traces continue through us: ``googclient_traceparent`` on push and on pull.

google-cloud-pubsub with OpenTelemetry tracing on puts the publisher's span
context in the ``googclient_traceparent`` attribute. A message without a
``traceparent`` of its own continues that trace (its span's parent is the
client's span; the push request's own context, when there is one, is a
link), and what we publish while tracing carries it too.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from eventbus import Context, Router, create_app
from eventbus.correlation import tracecontext
from eventbus.model.delivery import Delivery
from eventbus.pubsub.message import build_event, build_message
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock, LocalBus
from eventbus.workers.pull import Inbox, PullWorker
from tests.closing import app_closed_after_test, closed_after_test
from tests.telemetry.support import captured_lines, recorded

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
GOOGLE = {"googclient_traceparent": f"00-{TRACE}-{SPAN}-01"}
ENTITY = {"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"}


def routes() -> Router:
    router = Router()

    @router.handler("ORDER")
    def on_order(context: Context) -> None:
        context.log.info("order seen")
        context.emit("STEP", {"n": 1})

    router.handler("STEP", internal=True)(lambda context: None)
    return router


def message_data() -> bytes:
    return json.dumps(build_event("ORDER", {"id": 1}, entity=ENTITY).to_document()).encode()


class Pulled:
    """A pulled message as google-cloud-pubsub hands it to the callback."""

    def __init__(self, attributes: dict[str, str]) -> None:
        self.data, self.attributes = message_data(), attributes
        self.message_id, self.ordering_key, self.delivery_attempt = "m-1", "", 1
        self.answer = ""

    def ack(self) -> None:
        self.answer = "ack"

    def nack(self) -> None:
        self.answer = "nack"

    def ack_with_response(self) -> Any:
        raise AssertionError("not an exactly-once subscription")


def assert_continues_the_client_trace(rec: Any) -> None:
    (span,) = rec.named("message ORDER")
    assert f"{span.context.trace_id:032x}" == TRACE
    assert span.parent is not None and f"{span.parent.span_id:016x}" == SPAN


def test_a_push_continues_the_google_client_trace() -> None:
    rec = recorded(FakeClock())
    app = app_closed_after_test(create_app(routes(), Settings(), store=MemoryEventStore(),
                                           publisher=CapturingPublisher(),
                                           telemetry=rec.telemetry))
    body = {"message": {"data": base64.b64encode(message_data()).decode(), "messageId": "m-1",
                        "attributes": {"event_type": "ORDER", "event_version": "v1", **GOOGLE}},
            "subscription": "projects/p/subscriptions/s"}
    request = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    answer = app.test_client().post("/", json=body, headers={"traceparent": request})
    assert answer.status_code == 200
    assert_continues_the_client_trace(rec)
    (span,) = rec.named("message ORDER")
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [request[3:35]]


def test_a_pulled_message_continues_the_google_client_trace() -> None:
    rec = recorded(FakeClock())
    # Its processor, in a pull worker.
    bus = closed_after_test(LocalBus(routes(), telemetry=rec.telemetry))
    worker = PullWorker(bus.processor, Inbox(), subscription="projects/p/subscriptions/s")
    pulled = [Pulled({"event_type": "ORDER", "event_version": "v1", **GOOGLE}),
              Pulled({"event_type": "ORDER", "event_version": "v1", "idempotency_key": "two"})]
    worker.run_batch(pulled)
    assert [m.answer for m in pulled] == ["ack", "ack"]
    spans = rec.named("message ORDER")
    assert sorted(f"{span.context.trace_id:032x}" == TRACE for span in spans) == [False, True]
    (continued,) = [span for span in spans if f"{span.context.trace_id:032x}" == TRACE]
    assert continued.parent is not None and f"{continued.parent.span_id:016x}" == SPAN


def test_a_traceparent_of_its_own_wins_over_the_google_client_attribute() -> None:
    own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    found = tracecontext.from_attributes({**GOOGLE, "traceparent": own})
    assert found is not None and found.trace_id == own[3:35]


def test_with_tracing_off_log_lines_carry_the_google_client_trace() -> None:
    bus = closed_after_test(LocalBus(routes()))
    with captured_lines() as lines:
        bus.processor.process(Delivery(message_data(), {"event_type": "ORDER",
                                                        "event_version": "v1", **GOOGLE}))
    (seen,) = [line for line in lines if line["message"] == "order seen"]
    assert seen["logging.googleapis.com/trace"] == f"projects/proj/traces/{TRACE}"


@pytest.mark.parametrize("hostile", ["\ud800", "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
                                     "x" * 10_000, "00-zz-yy-01\x00"])
def test_a_hostile_google_client_attribute_is_ignored(hostile: str) -> None:
    assert tracecontext.from_attributes({"googclient_traceparent": hostile}) is None
    rec = recorded(FakeClock())
    bus = closed_after_test(LocalBus(routes(), telemetry=rec.telemetry))
    result = bus.processor.process(Delivery(message_data(), {
        "event_type": "ORDER", "event_version": "v1", "googclient_traceparent": hostile}))
    assert result.outcome.value in ("processed", "rejected")


def test_what_we_publish_while_tracing_carries_the_google_client_attribute_too() -> None:
    rec = recorded(FakeClock())
    bus = closed_after_test(LocalBus(routes(), telemetry=rec.telemetry))
    data, attributes = build_message(build_event("ORDER", {"id": 3}, entity=ENTITY))
    bus.publisher.publish_message(data, attributes)
    bus.drain()
    (step,) = [m for m in bus.messages.values() if m.attributes["event_type"] == "STEP"]
    assert step.attributes["googclient_traceparent"] == step.attributes["traceparent"]
    (publish,) = rec.named("publish")
    assert step.attributes["traceparent"].split("-")[2] == f"{publish.context.span_id:016x}"
