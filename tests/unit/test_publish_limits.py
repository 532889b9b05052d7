"""Publishers learn early: an event larger than the service stores is refused before sending.

``publish()``, ``Publisher`` and ``eventbus publish`` count an event as the
receiver will (``eventbus.pubsub.message.stored_size``: the parsed event and
its Pub/Sub metadata, against ``eventbus.model.content.MAX_BYTES``) and raise
``EventTooLarge`` (a ``PublishError`` and an ``InvalidEvent``) above it;
exactly at it is sent, and the service then stores it. Google's client is
faked as in tests/telemetry/test_request_lines.py. Last, ``eventbus show``
of a refused payload that came three times says so (one record, counted).
"""

from __future__ import annotations

import io
import json
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

import pytest

from eventbus.model import content
from eventbus.model.delivery import Delivery
from eventbus.model.errors import ContentProblem, EventTooLarge, InvalidEvent, PublishError
from eventbus.model.event import Event
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.ops import cli
from eventbus.processor import Processor
from eventbus.pubsub import publisher as publisher_module
from eventbus.pubsub.message import build_event, build_message, stored_size
from eventbus.pubsub.publisher import Publisher, publish
from eventbus.settings import Settings
from eventbus.settings_base import PUBSUB_MAX_DATA_BYTES
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock, LocalBus
from tests.closing import closed_after_test

ENTITY = {"partnerId": "p1", "entity_id": "order-1", "entity_type": "Order"}
LIMIT = content.MAX_BYTES


class FakeClient:
    """The methods of google-cloud-pubsub's client that ``Publisher`` uses; keeps what it sent."""

    def __init__(self, **options: Any) -> None:
        self.sent: list[tuple[bytes, dict[str, str]]] = []

    def topic_path(self, project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, ordering_key: str = "",
                **attributes: str) -> Future[str]:
        self.sent.append((data, attributes))
        future: Future[str] = Future()
        future.set_result(f"msg-{len(self.sent)}")
        return future

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        pass

    def stop(self) -> None:
        pass


def blob_event(chars: int) -> Event:
    return build_event("OR_MGMT", {"blob": "x" * chars}, entity=ENTITY)


def chars_at_the_limit(ordering_key: str | None = None) -> int:
    """The blob length whose event the service counts at exactly ``LIMIT`` bytes once stored."""
    # Each character of the blob is one byte of the count; the derived key's length is fixed.
    data, attributes = build_message(blob_event(0))
    return LIMIT - stored_size(data, attributes, ordering_key)


@pytest.fixture(scope="module")
def at_limit() -> int:
    return chars_at_the_limit("order-1")


def test_an_event_exactly_at_the_limit_is_built_and_one_byte_more_is_refused(
        at_limit: int) -> None:
    data, attributes = build_message(blob_event(at_limit), ordering_key="order-1")
    assert stored_size(data, attributes, "order-1") == LIMIT
    with pytest.raises(EventTooLarge) as refused:
        build_message(blob_event(at_limit + 1), ordering_key="order-1")
    error = refused.value
    assert (error.size, error.limit) == (LIMIT + 1, LIMIT)
    assert f"is {LIMIT + 1} bytes once stored" in str(error)
    assert f"the service stores at most {LIMIT} bytes (8 MiB)" in str(error)
    # A PublishError for callers that catch what publishing raises; permanent all the same.
    assert isinstance(error, PublishError) and isinstance(error, InvalidEvent)


def test_publisher_sends_an_event_at_the_limit_and_sends_nothing_over_it(
        at_limit: int) -> None:
    client = FakeClient()
    sender = Publisher("proj", "events", client=client)  # type: ignore[arg-type]
    assert sender.publish("OR_MGMT", {"blob": "x" * at_limit}, entity=ENTITY,
                          ordering_key="order-1") == "msg-1"
    with pytest.raises(PublishError, match=f"at most {LIMIT} bytes"):
        sender.publish("OR_MGMT", {"blob": "x" * (at_limit + 1)}, entity=ENTITY,
                       ordering_key="order-1")
    assert len(client.sent) == 1


def test_publish_refuses_the_nine_mib_event_before_sending(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The case: Pub/Sub takes 9 MiB (under its 10 MB), the service stores 8 MiB.
    clients: list[FakeClient] = []

    def client(**options: Any) -> FakeClient:
        clients.append(FakeClient(**options))
        return clients[-1]

    monkeypatch.setattr(publisher_module.pubsub_v1, "PublisherClient", client)
    nine_mib = 9 * 1024 * 1024
    with pytest.raises(EventTooLarge, match=r"is \d+ bytes once stored \(9\.0 MiB") as refused:
        publish("OR_MGMT", {"blob": "x" * nine_mib}, entity=ENTITY)
    assert refused.value.size > nine_mib and refused.value.limit == LIMIT
    assert [made.sent for made in clients] == [[]]  # a client was built; nothing sent
    assert publish("OR_MGMT", {"orderId": 1}, entity=ENTITY) == "msg-1"


def test_over_pubsubs_own_cap_is_too_large_too() -> None:
    # Ten million escaped characters are under 8 MiB once stored but over Pub/Sub's 10 MB.
    event = build_event("OR_MGMT", {"t": "\n" * (PUBSUB_MAX_DATA_BYTES // 2)}, entity=ENTITY)
    with pytest.raises(EventTooLarge, match=f"Pub/Sub takes at most {PUBSUB_MAX_DATA_BYTES}"):
        build_message(event)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(("data", "problem"), [
    ({"n": 2**63}, "64 bits"),
    ({"d": nested(content.MAX_DEPTH)}, "deeper than"),
    ({"a\u0000b": 1}, "NUL"),
])
def test_other_content_the_service_would_refuse_is_refused_too(data: dict[str, Any],
                                                                problem: str) -> None:
    with pytest.raises(ContentProblem, match=problem) as refused:
        build_message(build_event("OR_MGMT", data, entity=ENTITY))
    assert not isinstance(refused.value, PublishError)  # not too large: plainly invalid


def test_the_service_stores_what_the_publisher_sent_at_the_limit(at_limit: int) -> None:
    # The Pub/Sub metadata a real push brings (a message id, the time, the subscription,
    # a trace context) is within what the publisher counted: stored, not refused.
    data, attributes = build_message(blob_event(at_limit), ordering_key="order-1")
    traced = {**attributes, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    delivery = Delivery(data=data, attributes=traced, message_id="12345678901234567",
                        publish_time="2026-12-02T10:00:00.123456789Z",
                        subscription="projects/my-project/subscriptions/partner-events-push",
                        delivery_attempt=1, ordering_key="order-1")
    routes = Router()
    routes.handler("OR_MGMT")(lambda context: None)
    run = closed_after_test(Processor(MemoryEventStore(), routes, Settings(),
                                      FakeClock(datetime.now(UTC))))
    assert run.process(delivery).outcome is Outcome.PROCESSED


def test_the_local_bus_refuses_what_publish_refuses() -> None:
    routes = Router()
    routes.handler("OR_MGMT")(lambda context: None)
    bus = LocalBus(routes)
    with pytest.raises(EventTooLarge):
        bus.publish("OR_MGMT", {"blob": "x" * LIMIT}, entity=ENTITY)
    assert bus.results == []


def test_eventbus_publish_prints_the_size_and_the_limit_and_exits_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = CapturingPublisher()
    monkeypatch.setattr(cli, "publisher", lambda settings, timeout=30.0: fake)
    huge = {"event_type": "OR_MGMT", "entity": ENTITY, "data": {"blob": "x" * (LIMIT + 1)}}
    small = {"event_type": "OR_MGMT", "entity": ENTITY, "data": {"orderId": 1}}
    # More refusals in a row than count as "Pub/Sub is down": the last event is still tried.
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps([huge, huge, huge, huge, small])))
    assert cli.main(["publish", "-"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    lines = err.splitlines()
    for number, line in enumerate(lines[:4], 1):
        assert line.startswith(f"eventbus: event #{number} not published: event OR_MGMT is ")
        assert f"the service stores at most {LIMIT} bytes (8 MiB)" in line
    assert lines[-1] == "eventbus: published 1 of 5 events to partner-events"
    assert out.splitlines()[0].startswith("  #5: OR_MGMT ")
    assert [json.loads(message.data)["entity_data"] for message in fake.messages] == [
        {"orderId": 1}]


def test_show_says_how_often_a_refused_payload_came(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryEventStore()
    routes = Router()
    run = closed_after_test(Processor(store, routes, Settings(), FakeClock(datetime.now(UTC))))
    key = ""
    for number in range(3):  # published three times: three message ids, one record
        key = run.process(Delivery(b"{not json", {}, message_id=f"m-{number}")).key
    monkeypatch.setattr(cli, "open_store", lambda settings: store)
    assert cli.main(["show", key]) == 0
    shown = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
             for line in capsys.readouterr().out.splitlines() if ":" in line}
    assert shown["delivered"] == "3 times, the same bytes each time"
