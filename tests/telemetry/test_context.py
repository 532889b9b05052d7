"""Trace context parsing (strict, never raising), the scope, and hostile headers on a live app."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import Context, Router, create_app
from eventbus.correlation import tracecontext
from eventbus.correlation.tracecontext import (
    TraceContext,
    from_attributes,
    from_headers,
    parse_cloud_trace,
    parse_traceparent,
)
from eventbus.pubsub.message import build_event
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from tests.closing import app_closed_after_test
from tests.hypothesis_profiles import examples
from tests.telemetry.support import captured_lines, recorded

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("value", "expected"), [
    (VALID, TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)),
    (VALID[:-1] + "0", TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")),
    (f"  {VALID} ", TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)),
    ("01" + VALID[2:] + "-future", TraceContext("4bf92f3577b34da6a3ce929d0e0e4736",
                                                 "00f067aa0ba902b7", True)),
])
def test_traceparent_values_that_parse(value: str, expected: TraceContext) -> None:
    assert parse_traceparent(value) == expected


@pytest.mark.parametrize("value", [
    "", "garbage", VALID.upper(), "ff" + VALID[2:], VALID + "-extra",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "00-\ud800" + VALID[4:],
    None, 42, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
])
def test_traceparent_values_that_do_not(value: Any) -> None:
    assert parse_traceparent(value) is None


def test_google_trace_header() -> None:
    parsed = parse_cloud_trace("105445AA7843BC8BF206B12000100000/18446744073709551615;o=1")
    assert parsed == TraceContext("105445aa7843bc8bf206b12000100000", "ffffffffffffffff", True)
    assert parse_cloud_trace("105445aa7843bc8bf206b12000100000/1;o=0") == TraceContext(
        "105445aa7843bc8bf206b12000100000", "0000000000000001", False)
    bare = parse_cloud_trace("105445aa7843bc8bf206b12000100000")
    assert bare is not None and len(bare.span_id) == 16 and bare.span_id != "0" * 16
    for bad in ("105445aa7843bc8bf206b12000100000/18446744073709551616", "x/1", "\udcff/1",
                "0" * 32 + "/1", "105445aa7843bc8bf206b12000100000/1;o=1;x"):
        assert parse_cloud_trace(bad) is None


def test_headers_prefer_traceparent_and_keep_a_clean_tracestate() -> None:
    found = from_headers({"traceparent": VALID, "tracestate": "congo=t61rcWkgMzE",
                          "X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/1"})
    assert found is not None and found.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert found.attributes() == {"traceparent": VALID, "tracestate": "congo=t61rcWkgMzE"}
    google = from_headers({"X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/1"})
    assert google is not None and google.trace_id == "105445aa7843bc8bf206b12000100000"
    dirty = from_attributes({"traceparent": VALID, "tracestate": "a=b\n\x00" + "x" * 600})
    assert dirty is not None and dirty.tracestate == ""


def test_a_scope_holds_the_trace_and_the_request_id_for_the_block_only() -> None:
    assert tracecontext.current_scope() is None
    trace = tracecontext.new_trace()
    with tracecontext.scope(trace, "req-1"):
        assert tracecontext.current_trace() == trace
        assert tracecontext.current_request_id() == "req-1"
        assert tracecontext.carried({})["traceparent"] == trace.traceparent
        with tracecontext.adopted(None, "other"):
            assert tracecontext.current_request_id() == "req-1"  # an outer id is kept
    assert tracecontext.current_scope() is None and tracecontext.current_request_id() == ""
    assert trace.local and parse_traceparent(trace.traceparent) == trace


# --- hostile headers never break a request ---------------------------------------------


@pytest.fixture()
def app() -> Any:
    """One app for all of a test's examples; its processor is closed after the test."""
    routes = Router()

    @routes.handler("OK")
    def on_ok(ctx: Context) -> None:
        ctx.log.info("ok")

    return app_closed_after_test(create_app(routes, Settings(relay_inline=False),
                                            store=MemoryEventStore()))


DATA = json.dumps(build_event("OK", {}, entity={"partnerId": "p", "entity_id": "e",
                                                "entity_type": "T"}).to_document()).encode()
HEADER_TEXT = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=5),
    st.from_regex(r"[0-9a-fA-F]{32}/[0-9]{0,25}(;o=[0-9]{0,3})?", fullmatch=True),
    st.from_regex(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.{0,10})?",
                  fullmatch=True),
)


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(traceparent=HEADER_TEXT, cloud=HEADER_TEXT, state=HEADER_TEXT, request_id=HEADER_TEXT,
       attribute=HEADER_TEXT)
def test_hostile_trace_headers_and_attributes_never_break_a_request(
        app: Any, traceparent: str, cloud: str, state: str, request_id: str,
        attribute: str) -> None:
    for value in (traceparent, cloud, state, request_id, attribute):
        assert parse_traceparent(value) is None or parse_traceparent(value) is not None
        parse_cloud_trace(value)
    environ = {"HTTP_TRACEPARENT": traceparent, "HTTP_X_CLOUD_TRACE_CONTEXT": cloud,
               "HTTP_TRACESTATE": state, "HTTP_X_REQUEST_ID": request_id}
    body = {"message": {"data": base64.b64encode(DATA).decode(), "messageId": "m-1",
                        "attributes": {"event_type": "OK", "event_version": "v1",
                                       "traceparent": attribute, "tracestate": state}},
            "subscription": "projects/p/subscriptions/s"}
    with captured_lines() as lines:
        answer = app.test_client().post("/", json=body, environ_overrides=environ)
    assert answer.status_code == 200
    assert answer.headers["X-Request-Id"].isascii()
    assert all(line["logging.googleapis.com/trace"].startswith("projects/") for line in lines)


@settings(max_examples=examples(60), deadline=None)
@given(attribute=HEADER_TEXT, state=HEADER_TEXT)
def test_hostile_attributes_never_break_a_traced_message(attribute: str, state: str) -> None:
    from eventbus.model.delivery import Delivery
    from eventbus.processor import Processor
    from eventbus.testing import FakeClock

    clock = FakeClock()
    rec = recorded(clock)
    routes = Router()
    routes.handler("OK")(lambda ctx: None)
    delivery = Delivery(data=DATA, attributes={"traceparent": attribute, "tracestate": state},
                        message_id=attribute, publish_time=attribute)
    with contextlib.closing(Processor(MemoryEventStore(), routes, Settings(), clock,
                                      middleware=rec.telemetry.middleware())) as processor:
        outcome = processor.process(delivery).outcome.value
    assert outcome in ("processed", "rejected")  # rejected: a message id no store keeps
    (span,) = [span for span in rec.finished() if span.name.startswith("message")]
    assert span.attributes["eventbus.outcome"] == outcome
