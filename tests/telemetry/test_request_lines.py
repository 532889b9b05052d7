"""Request lines: the inbound line carries ``httpRequest`` and the trace; every line of a request
carries the same trace; each partner call and each publish writes exactly one outbound line."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import requests

from eventbus import Context, Router, create_app
from eventbus.correlation import logs, tracecontext
from eventbus.correlation.session import logging_session
from eventbus.model.errors import PublishError
from eventbus.model.outcome import Outcome
from eventbus.pubsub.message import build_event
from eventbus.pubsub.publisher import Publisher
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import LocalBus
from handlers.notifications import NOTIFY
from tests.closing import app_closed_after_test, closed_after_test
from tests.partner_server import PartnerServer
from tests.service.conftest import app_router, memory_database
from tests.telemetry.support import captured_lines

TRACE = "logging.googleapis.com/trace"
ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "order-59734",
          "entity_type": "Order"}
CONFIRMED = {"orderId": 59734, "orderStatusLatest": "OR_CNF",
             "orderStatusLatestTimestamp": 1655292804}
CLOUD_TRACE_ID = "105445aa7843bc8bf206b12000100000"


def push_body(event_type: str = "OK", **attributes: str) -> dict[str, Any]:
    data = json.dumps(build_event(event_type, {}, entity=ENTITY).to_document()).encode()
    return {"message": {"data": base64.b64encode(data).decode(), "messageId": "m-1",
                        "attributes": {"event_type": event_type, "event_version": "v1",
                                       **attributes}},
            "subscription": "projects/p/subscriptions/s"}


@pytest.fixture()
def client() -> Any:
    routes = Router()

    @routes.handler("OK")
    def on_ok(context: Context) -> None:
        context.log.info("handler line")

    app = app_closed_after_test(create_app(routes, Settings(relay_inline=False,
                                                            project_id="proj"),
                                           store=MemoryEventStore()))
    return app.test_client()


def outbound(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("logType") == "REQUEST_OUTBOUND"]


def test_the_inbound_line_has_http_request_and_every_line_the_pushs_trace(client: Any) -> None:
    headers = {"X-Cloud-Trace-Context": f"{CLOUD_TRACE_ID}/1;o=1", "User-Agent": "pubsub-push"}
    with captured_lines() as lines:
        answer = client.post("/", json=push_body(), headers=headers)
    assert answer.status_code == 200
    (request,) = [line for line in lines if line.get("logType") == "REQUEST_INBOUND"]
    (handler,) = [line for line in lines if line["message"] == "handler line"]
    http = request["httpRequest"]
    assert http["requestMethod"] == "POST" and http["requestUrl"] == "http://localhost/"
    assert http["status"] == 200 and http["userAgent"] == "pubsub-push"
    assert http["remoteIp"] == "127.0.0.1" and http["latency"].endswith("s")
    assert float(http["latency"][:-1]) >= 0
    expected = f"projects/proj/traces/{CLOUD_TRACE_ID}"
    assert request[TRACE] == handler[TRACE] == expected
    assert request["requestId"] == handler["requestId"] == answer.headers["X-Request-Id"]
    assert {"logType", "service", "method", "path", "status", "requestId", "duration"} <= set(
        request)


def test_traceparent_wins_over_googles_header(client: Any) -> None:
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
               "X-Cloud-Trace-Context": f"{CLOUD_TRACE_ID}/1;o=1"}
    with captured_lines() as lines:
        client.post("/", json=push_body(), headers=headers)
    traces = {line[TRACE] for line in lines}
    assert traces == {"projects/proj/traces/4bf92f3577b34da6a3ce929d0e0e4736"}


def test_a_message_of_a_cascade_logs_under_the_cascades_trace_not_the_pushs(client: Any) -> None:
    cascade = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"X-Cloud-Trace-Context": f"{CLOUD_TRACE_ID}/1;o=1"}
    with captured_lines() as lines:
        client.post("/", json=push_body(traceparent=cascade), headers=headers)
    assert {line[TRACE] for line in lines} == {
        "projects/proj/traces/0af7651916cd43dd8448eb211c80319c"}


def test_a_request_without_any_trace_still_gets_one_on_every_line(client: Any) -> None:
    with captured_lines() as lines:
        client.post("/", json=push_body())
        client.post("/", json={"not": "a push"})
    assert len(lines) >= 3
    assert all(line[TRACE].startswith("projects/proj/traces/") for line in lines)
    requests_lines = [line for line in lines if line.get("logType") == "REQUEST_INBOUND"]
    assert [line["status"] for line in requests_lines] == [200, 400]
    assert requests_lines[0][TRACE] != requests_lines[1][TRACE]


# --- partner calls ---------------------------------------------------------------------


@pytest.fixture()
def partner() -> Iterator[PartnerServer]:
    with PartnerServer() as server:
        yield server


def test_a_partner_call_writes_exactly_one_outbound_line(partner: PartnerServer) -> None:
    bus = closed_after_test(LocalBus(app_router(partner.template), database=memory_database()))
    with captured_lines() as lines:
        bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    assert len(partner.calls) == 1
    (line,) = outbound(lines)
    notify = next(result for result in bus.results if result.event_type == NOTIFY)
    assert line["method"] == "POST" and line["status"] == 200
    assert line["host"] == partner.url.removeprefix("http://")
    assert line["path"] == "/partners/p1/events"
    assert line["target"] == f"{partner.url}/partners/p1/events"
    assert line["idempotency_key"] == partner.calls[0].key
    assert line["duration"] >= 0 and line["httpRequest"]["status"] == 200
    assert line["service"] == "svc" and line["severity"] == "INFO"
    handler_lines = [other for other in lines if other.get("idempotency_key") == notify.key
                     and other is not line]
    assert all(other[TRACE] == line[TRACE] for other in handler_lines)
    assert partner.calls[0].headers.get("X-Request-Id") == line["requestId"]


def test_a_call_that_cannot_connect_writes_one_line_with_the_error_class() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the call
    url = f"http://127.0.0.1:{port}/partners/{{partnerId}}/events"
    bus = closed_after_test(LocalBus(app_router(url), database=memory_database()))
    with captured_lines() as lines:
        bus.publish("OR_MGMT", CONFIRMED, entity=ENTITY, version="v2")
    assert [result.outcome for result in bus.results][-1] is Outcome.RETRY
    (line,) = outbound(lines)
    assert line["error"] == "ConnectionError" and "status" not in line
    assert line["severity"] == "WARNING" and "status" not in line["httpRequest"]


def test_wrapping_a_session_twice_still_logs_once(partner: PartnerServer) -> None:
    session = logging_session(logging_session(requests.Session()))
    with captured_lines() as lines:
        session.post(f"{partner.url}/x", json={}, timeout=5)
    assert len(outbound(lines)) == 1


# --- publishes -------------------------------------------------------------------------


class FakeClient:
    """The two methods of google-cloud-pubsub's client that ``Publisher`` uses."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.sent = error, []

    def topic_path(self, project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, ordering_key: str = "",
                **attributes: str) -> Future[str]:
        self.sent.append(attributes)
        future: Future[str] = Future()
        if self.error is not None:
            future.set_exception(self.error)
        else:
            future.set_result("msg-1")
        return future

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        pass


def test_a_publish_writes_one_outbound_line_and_carries_the_callers_trace() -> None:
    client = FakeClient()
    publisher = Publisher("proj", "events", client=client)  # type: ignore[arg-type]
    caller = tracecontext.new_trace(sampled=True)
    with captured_lines() as lines, tracecontext.scope(caller, "req-1"):
        publisher.publish("OK", {}, entity=ENTITY, idempotency_key="k-1")
    (line,) = outbound(lines)
    assert line["kind"] == "publish" and line["status"] == 200
    assert line["target"] == "projects/proj/topics/events"
    assert line["idempotency_key"] == client.sent[0]["idempotency_key"]
    assert line["requestId"] == "req-1"
    assert line[TRACE] == f"projects/proj/traces/{caller.trace_id}"
    assert client.sent[0]["traceparent"] == caller.traceparent


def test_a_failed_publish_writes_one_line_with_the_error_class() -> None:
    publisher = Publisher("proj", "events",  # type: ignore[arg-type]
                          client=FakeClient(TimeoutError("slow")))
    with captured_lines() as lines, pytest.raises(PublishError):
        publisher.publish_message(b"{}", {"idempotency_key": "k-1"})
    (line,) = outbound(lines)
    assert line["error"] == "TimeoutError" and line["severity"] == "WARNING"


def test_a_given_traceparent_is_kept() -> None:
    client = FakeClient()
    publisher = Publisher("proj", "events", client=client)  # type: ignore[arg-type]
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracecontext.scope(tracecontext.new_trace()):
        publisher.publish_message(b"{}", {"traceparent": given})
    assert client.sent[0]["traceparent"] == given


FIELDS = {"method": "POST", "path": "/", "status": 200, "requestId": "r-1", "duration": 1.5,
          "httpRequest": {"requestMethod": "POST", "status": 200}, "outcome": "processed"}


def test_the_direct_request_line_is_the_line_the_logging_path_writes() -> None:
    # configure()'s handler alone: the direct path; a filter anywhere: the stdlib's path.
    requests = logging.getLogger("eventbus.request")
    passing = logging.Filter("eventbus.request")
    with captured_lines() as lines, tracecontext.scope(tracecontext.new_trace(), "r-0"):
        logs.request_line(FIELDS)
        requests.addFilter(passing)
        try:
            logs.request_line(FIELDS)
        finally:
            requests.removeFilter(passing)
    direct, ordinary = ({k: v for k, v in line.items() if k != "timestamp"} for line in lines)
    assert direct == ordinary
    assert direct["message"] == "POST / 200" and direct["logType"] == "REQUEST_INBOUND"
    assert direct["severity"] == "INFO" and direct["logger"] == "eventbus.request"
    assert direct[TRACE].startswith("projects/proj/traces/")


def test_an_applications_own_handler_gets_the_request_line_as_a_record(
        caplog: pytest.LogCaptureFixture) -> None:
    with captured_lines() as lines, caplog.at_level(logging.INFO, logger="eventbus.request"):
        logging.getLogger("eventbus.request").addHandler(caplog.handler)
        try:
            logs.request_line({**FIELDS, "status": 503, "outcome": ""})
        finally:
            logging.getLogger("eventbus.request").removeHandler(caplog.handler)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.getMessage() == "POST / 503"
    assert record.logType == "REQUEST_INBOUND"
    assert [line["severity"] for line in lines] == ["ERROR"]


def test_a_request_line_below_the_handlers_level_is_not_written() -> None:
    with captured_lines() as lines:
        logging.getLogger("eventbus").handlers[0].setLevel(logging.WARNING)
        logs.request_line(FIELDS)
        logs.request_line({**FIELDS, "status": 503, "outcome": ""})
    assert [line["status"] for line in lines] == [503]
