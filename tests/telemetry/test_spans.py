"""Sampling on the SDK tracer (a cascade kept or dropped whole), and the pymongo
instrumentation's spans: only for the handler's own commands, never for claim or finish."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from eventbus import Context, Router
from eventbus.model.delivery import Delivery
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.telemetry import providers
from eventbus.testing import FakeClock
from tests.closing import closed_after_test
from tests.hypothesis_profiles import examples
from tests.telemetry.support import parent_of, recorded


def test_a_trace_the_sampler_drops_makes_non_recording_spans_only() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=providers.sampler(0.5))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lib")
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
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    sampler = providers.sampler(0.5)

    def kept(parent: SpanContext | None, trace_id: int) -> bool:
        context = (None if parent is None else
                   trace.set_span_in_context(NonRecordingSpan(parent)))
        decided = sampler.should_sample(context, trace_id, "message")
        return decided.decision is Decision.RECORD_AND_SAMPLE

    decisions = set()
    for trace_id in range(1, 2**64, 2**58):
        root = kept(None, trace_id)
        decisions.add(root)
        remote = SpanContext(trace_id, 7, True, TraceFlags(0))
        assert kept(remote, trace_id) == root  # an unsampled parent message
        local = SpanContext(trace_id, 7, False, TraceFlags(1 if root else 0))
        assert kept(local, trace_id) == root
    assert decisions == {True, False}


def test_claim_and_finish_stand_for_their_round_trip_and_handler_commands_get_pymongo_spans(
        mongo_uri: str) -> None:
    from opentelemetry.instrumentation.pymongo import PymongoInstrumentor

    from eventbus.store.mongo import MongoEventStore

    if PymongoInstrumentor()._commandtracer_instance is not None:
        # pymongo's listener keeps the first provider that instrumented it in this process
        pytest.skip("pymongo was instrumented before in this process")
    clock = FakeClock()
    rec = recorded(clock)
    assert rec.telemetry.tracer_provider is not None
    installed = providers.instrument_libraries(rec.telemetry.tracer_provider, ("pymongo",))
    rec.telemetry.suppress_store = True  # what from_settings sets when it instruments pymongo
    store = MongoEventStore.from_settings(Settings(mongodb_uri=mongo_uri,
                                                   mongodb_db="telemetry_spans_test"))
    try:
        routes = Router()
        routes.handler("OK")(lambda context: context.db["projections"].insert_one({"a": 1}))
        processor = Processor(store, routes, Settings(), clock,
                              middleware=rec.telemetry.middleware())
        document = {"event_type": "OK", "event_version": "v1",
                    "entity_metadata": {"partnerId": "p", "entity_id": "e",
                                        "entity_type": "T"}, "entity_data": {}}
        rec.spans.clear()
        with contextlib.closing(processor):  # before its store closes
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
    # one CLIENT span: the handler's insert; claim and finish suppressed pymongo's
    (mongo,) = [span for span in rec.finished() if span.kind is SpanKind.CLIENT]
    assert parent_of(mongo) == handler.context.span_id  # the handler's own insert
    assert mongo.attributes is not None and mongo.attributes.get("db.system") == "mongodb"
    assert mongo.name.endswith(".insert")
    for step in (claim, finish):  # each is the store's one round trip
        assert step.attributes is not None and step.attributes["db.system.name"] == "mongodb"


def test_a_message_the_sampler_drops_makes_no_child_spans_and_still_counts() -> None:
    rec = recorded(FakeClock(), ratio=0.3)
    routes = Router()
    routes.handler("OK")(lambda context: None)
    processor = closed_after_test(Processor(MemoryEventStore(), routes, Settings(), FakeClock(),
                                            middleware=rec.telemetry.middleware()))
    for number in range(60):
        document = {"event_type": "OK", "event_version": "v1",
                    "entity_metadata": {"partnerId": "p", "entity_id": f"e-{number}",
                                        "entity_type": "T"}, "entity_data": {}}
        processor.process(Delivery(data=json.dumps(document).encode(), attributes={},
                                   message_id=f"m-{number}"))
    kept = rec.named("message OK")
    assert 0 < len(kept) < 60
    for name in ("claim", "handler", "finish"):  # only under the kept messages
        assert {parent_of(span) for span in rec.named(name)} == {
            span.context.span_id for span in kept}
    assert rec.outcomes() == {"processed": 60}


HOSTILE_TEXT = st.one_of(
    st.text(max_size=64), st.just("\ud800"), st.just("\x00"), st.just("x" * 20_000),
    st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01\x00"), st.just("a=" + "b" * 9000),
    st.builds(lambda n: f"00-{n:032x}-{n:016x}-01", st.integers(0, 2**70)))


@settings(max_examples=examples(60), deadline=None)
@given(traceparent=HOSTILE_TEXT, tracestate=HOSTILE_TEXT)
def test_hostile_trace_attributes_never_break_a_traced_message(traceparent: str,
                                                              tracestate: str) -> None:
    rec = recorded(FakeClock())
    routes = Router()

    @routes.handler("OK")
    def emits(context: Context) -> None:
        context.emit("CHILD", {})

    routes.handler("CHILD", internal=True)(lambda context: None)
    document = {"event_type": "OK", "event_version": "v1",
                "entity_metadata": {"partnerId": "p", "entity_id": "e", "entity_type": "T"},
                "entity_data": {}}
    with contextlib.closing(Processor(MemoryEventStore(), routes, Settings(), FakeClock(),
                                      middleware=rec.telemetry.middleware())) as processor:
        result = processor.process(Delivery(
            data=json.dumps(document).encode(), message_id="m-1",
            attributes={"traceparent": traceparent, "tracestate": tracestate}))
    assert result.outcome.value in ("processed", "rejected")  # stored either way
    (message,) = [span for span in rec.finished() if span.name.startswith("message")]
    assert message.attributes is not None
    assert message.attributes["eventbus.outcome"] == result.outcome.value
