"""The lean tracer: OpenTelemetry API semantics, spans delivered to the SDK's processors, and the
standard instrumentations' spans nesting under the service's own (pymongo under claim/finish)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from eventbus import Router
from eventbus.model.delivery import Delivery
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.telemetry import providers
from eventbus.telemetry.spans import MAX_ATTRIBUTES, LeanSpan, LeanTracerProvider
from eventbus.testing import FakeClock
from tests.telemetry.support import parent_of, recorded


@pytest.fixture()
def exported() -> Iterator[tuple[LeanTracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=providers.sampler(1.0))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield LeanTracerProvider(provider), exporter
    provider.shutdown()


def test_spans_reach_the_processors_with_their_parent_scope_and_attributes(
        exported: tuple[LeanTracerProvider, InMemorySpanExporter]) -> None:
    lean, exporter = exported
    tracer = lean.get_tracer("lib", "1.2")
    with tracer.start_as_current_span("outer", kind=SpanKind.SERVER,
                                      attributes={"a": 1}) as outer:
        assert isinstance(outer, LeanSpan) and trace.get_current_span() is outer
        inner = tracer.start_span("inner")
        inner.set_attributes({"ok": "yes", "list": ["x", "y"], "bad": {"no": 1}, "none": None})
        inner.add_event("seen", {"n": 1})
        inner.update_name("renamed")
        inner.end()
        inner.set_attribute("late", 1)  # ignored: ended
        inner.end()  # once only
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"outer", "renamed"}
    renamed = spans["renamed"]
    assert dict(renamed.attributes or {}) == {"ok": "yes", "list": ("x", "y")}
    assert [event.name for event in renamed.events] == ["seen"]
    assert renamed.parent is not None and renamed.parent.span_id == spans["outer"].context.span_id
    assert renamed.context.trace_id == spans["outer"].context.trace_id
    assert spans["outer"].kind is SpanKind.SERVER and spans["outer"].parent is None
    assert renamed.instrumentation_scope is not None
    assert (renamed.instrumentation_scope.name, renamed.instrumentation_scope.version) == (
        "lib", "1.2")
    assert renamed.start_time is not None and renamed.end_time is not None
    assert renamed.end_time >= renamed.start_time


def test_errors_status_and_limits(exported: tuple[LeanTracerProvider,
                                                  InMemorySpanExporter]) -> None:
    lean, exporter = exported
    tracer = lean.get_tracer("lib")
    with pytest.raises(ValueError), tracer.start_as_current_span("failing"):
        raise ValueError("broken")
    span = tracer.start_span("capped")
    for number in range(MAX_ATTRIBUTES + 10):
        span.set_attribute(f"k{number}", number)
    span.set_status(Status(StatusCode.OK))
    span.set_status(StatusCode.ERROR, "too late")  # OK is final
    span.end()
    failing, capped = exporter.get_finished_spans()
    assert failing.status.status_code is StatusCode.ERROR
    (event,) = failing.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert len(capped.attributes or {}) == MAX_ATTRIBUTES
    assert capped.status.status_code is StatusCode.OK


def test_a_trace_the_sampler_drops_makes_non_recording_spans_only() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=providers.sampler(0.5))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = LeanTracerProvider(provider).get_tracer("lib")
    kept = dropped = 0
    for _ in range(200):
        with tracer.start_as_current_span("root") as root:
            child = tracer.start_span("child")
            assert child.get_span_context().trace_flags.sampled == (
                root.get_span_context().trace_flags.sampled)
            child.end()
            if root.is_recording():
                kept += 1
            else:
                dropped += 1
    assert kept and dropped
    assert len(exporter.get_finished_spans()) == 2 * kept


def test_the_sampler_keeps_a_cascade_whole() -> None:
    sampler = providers.CascadeSampler(0.5)
    from opentelemetry.trace import SpanContext, TraceFlags

    for trace_id in range(1, 2**64, 2**58):
        root = sampler.keeps(trace.INVALID_SPAN_CONTEXT, trace_id)
        remote = SpanContext(trace_id, 7, True, TraceFlags(0))
        assert sampler.keeps(remote, trace_id) == root  # an unsampled parent message
        local = SpanContext(trace_id, 7, False, TraceFlags(1 if root else 0))
        assert sampler.keeps(local, trace_id) == root


def test_claim_and_finish_stand_for_their_round_trip_and_handler_commands_get_pymongo_spans(
        mongo_uri: str) -> None:
    from opentelemetry.instrumentation.pymongo import PymongoInstrumentor

    from eventbus.store.mongo import MongoEventStore

    if PymongoInstrumentor()._commandtracer_instance is not None:
        # pymongo's listener keeps the first provider that instrumented it in this process
        pytest.skip("pymongo was instrumented before in this process")
    clock = FakeClock()
    rec = recorded(clock)
    assert rec.telemetry.spans is not None
    installed = providers.instrument_libraries(rec.telemetry.spans, ("pymongo",))
    store = MongoEventStore.from_settings(Settings(mongodb_uri=mongo_uri,
                                                   mongodb_db="telemetry_spans_test"))
    try:
        routes = Router()
        routes.handler("OK")(lambda context: context.db["projections"].insert_one({"a": 1}))
        processor = Processor(store, routes, Settings(), clock, telemetry=rec.telemetry)
        document = {"event_type": "OK", "event_version": "v1",
                    "entity_metadata": {"partnerId": "p", "entity_id": "e",
                                        "entity_type": "T"}, "entity_data": {}}
        rec.spans.clear()
        result = processor.process(Delivery(data=json.dumps(document).encode(),
                                            attributes={}, message_id="m-1"))
        assert result.outcome.value == "processed"
    finally:
        for instrumentor in installed:
            instrumentor.uninstrument()
        store.collection.database.client.drop_database("telemetry_spans_test")
        store.close()
    (claim,) = rec.named("claim")
    (finish,) = rec.named("finish")
    (handler,) = rec.named("handler")
    (mongo,) = [span for span in rec.finished() if span.kind is SpanKind.CLIENT]
    assert parent_of(mongo) == handler.context.span_id  # the handler's own insert
    assert mongo.attributes is not None and mongo.attributes.get("db.system") == "mongodb"
    assert mongo.name.endswith(".insert")
    for step in (claim, finish):  # each is the store's one round trip
        assert step.attributes is not None and step.attributes["db.system.name"] == "mongodb"
