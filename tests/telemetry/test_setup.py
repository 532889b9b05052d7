"""Telemetry from settings, the store primitive behind the outbox gauge, and the import rules:
OpenTelemetry's SDK, exporters and instrumentations load only when an exporter is configured."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from eventbus.model.keys import fingerprint
from eventbus.settings import Settings, SettingsError
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.store.memory import MemoryEventStore
from eventbus.telemetry import Telemetry, from_settings, providers
from eventbus.telemetry.otel import OtelTelemetry
from tests.contract.conftest import DELIVERY, EVENT

SRC = Path(__file__).resolve().parents[2] / "src"


def test_telemetry_is_off_by_default() -> None:
    telemetry = from_settings(Settings())
    assert type(telemetry) is Telemetry and not telemetry.tracing and not telemetry.metering
    assert telemetry.metrics_page() is None


def test_the_noop_exporters_make_spans_and_metrics_and_drop_them() -> None:
    telemetry = from_settings(
        Settings(telemetry_exporter="noop", metrics_exporter="noop", trace_sample_ratio=1.0),
        instrument=False)
    assert isinstance(telemetry, OtelTelemetry) and telemetry.tracing and telemetry.metering
    assert telemetry.tracer_provider is not None
    with telemetry.tracer_provider.get_tracer("t").start_as_current_span("s") as span:
        assert span.is_recording()
    telemetry.shutdown()


def test_otlp_and_prometheus_build_from_settings() -> None:
    telemetry = from_settings(
        Settings(telemetry_exporter="otlp", metrics_exporter="prometheus"), instrument=False)
    assert isinstance(telemetry, OtelTelemetry)
    page = telemetry.metrics_page()
    assert page is not None and page[1].startswith("text/plain")
    telemetry.shutdown()


def test_cloud_trace_is_the_google_exporter() -> None:
    from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

    assert providers.SPAN_EXPORTERS["cloudtrace"] is providers.cloud_trace_exporter
    assert CloudTraceSpanExporter.__module__.startswith("opentelemetry.exporter.cloud_trace")


@pytest.mark.parametrize(("variable", "value"), [
    ("EVENTBUS_TELEMETRY_EXPORTER", "jaeger"), ("EVENTBUS_METRICS_EXPORTER", "statsd"),
    ("EVENTBUS_TRACE_SAMPLE_RATIO", "1.5"), ("EVENTBUS_TRACE_SAMPLE_RATIO", "0"),
])
def test_bad_telemetry_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: value})


def test_settings_read_the_telemetry_variables() -> None:
    read = Settings.from_env({"EVENTBUS_TELEMETRY_EXPORTER": "CloudTrace",
                              "EVENTBUS_METRICS_EXPORTER": "prometheus",
                              "EVENTBUS_TRACE_SAMPLE_RATIO": "0.25",
                              "EVENTBUS_METRICS_INTERVAL_SECONDS": "15"})
    assert (read.telemetry_exporter, read.metrics_exporter) == ("cloudtrace", "prometheus")
    assert (read.trace_sample_ratio, read.metrics_interval_seconds) == (0.25, 15.0)


INSTRUMENT_ONCE = """
from opentelemetry.instrumentation.pymongo import PymongoInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from eventbus.settings import Settings
from eventbus.telemetry.otel import OtelTelemetry
both = ("pymongo", "requests")
telemetry = OtelTelemetry.from_settings(Settings(telemetry_exporter="noop", trace_libraries=both))
assert PymongoInstrumentor().is_instrumented_by_opentelemetry
assert RequestsInstrumentor().is_instrumented_by_opentelemetry
again = OtelTelemetry.from_settings(Settings(telemetry_exporter="noop", trace_libraries=both))
assert again.instrumentors == []  # the first one's stay; nothing twice
again.shutdown()
telemetry.shutdown()
assert not PymongoInstrumentor().is_instrumented_by_opentelemetry
assert not RequestsInstrumentor().is_instrumented_by_opentelemetry
none = OtelTelemetry.from_settings(Settings(telemetry_exporter="noop",
                                            trace_libraries=("none",)))
assert none.instrumentors == [] and not PymongoInstrumentor().is_instrumented_by_opentelemetry
default = OtelTelemetry.from_settings(Settings(telemetry_exporter="noop"))
assert not PymongoInstrumentor().is_instrumented_by_opentelemetry  # only when asked for
assert RequestsInstrumentor().is_instrumented_by_opentelemetry
default.shutdown()
"""


def test_the_instrumentations_are_installed_once_and_removed_on_shutdown() -> None:
    # In a process of its own: pymongo's command listeners cannot be unregistered, so the
    # first provider that instruments pymongo keeps it for the process.
    done = subprocess.run([sys.executable, "-c", INSTRUMENT_ONCE], capture_output=True,
                          text=True, cwd=SRC.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


# --- the store primitive behind the outbox gauge ---------------------------------------


@pytest.fixture(params=["memory", "mongo"])
def store(request: pytest.FixtureRequest) -> Iterator[EventStore]:
    if request.param == "memory":
        yield MemoryEventStore()
        return
    from eventbus.store.mongo import MongoEventStore

    uri: str = request.getfixturevalue("mongo_uri")
    database = request.getfixturevalue("mongo_db")
    built = MongoEventStore.from_settings(Settings(mongodb_uri=uri, mongodb_db=database.name))
    built.ensure_indexes()
    yield built
    built.close()


def child(key: str, created: datetime, status: str = "PENDING") -> dict[str, object]:
    return {"idempotency_key": key, **EVENT.to_document(), "status": status,
            "payload_fingerprint": fingerprint(EVENT), "created_at": created}


def test_the_oldest_pending_outbox_entry(store: EventStore) -> None:
    now = documents.bson_time(datetime.now(UTC))
    assert store.oldest_pending_outbox() is None
    fields = documents.event_fields(EVENT, DELIVERY, fingerprint=fingerprint(EVENT))
    for number, (age, status) in enumerate([(30, "PENDING"), (90, "PUBLISHED"),
                                            (60, "PENDING")]):
        key = f"k-{number}"
        claim = store.claim(key, fields, now)
        store.succeed(key, claim.owner, now,
                      [child(f"{key}/0:C", now - timedelta(seconds=age), status)])
    assert store.oldest_pending_outbox() == now - timedelta(seconds=60)


def test_an_unreachable_mongo_store_raises_store_unavailable() -> None:
    import socket

    from eventbus.model.errors import StoreUnavailable
    from eventbus.store.mongo import MongoEventStore

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = MongoEventStore.from_settings(Settings(mongodb_uri=f"mongodb://127.0.0.1:{port}/",
                                                  store_timeout_ms=200))
    with pytest.raises(StoreUnavailable):
        down.oldest_pending_outbox()
    down.close()


# --- import rules ------------------------------------------------------------------------

OTEL_MODULES = {"eventbus/telemetry/otel.py", "eventbus/telemetry/providers.py",
                "eventbus/telemetry/stages.py", "eventbus/partners/gauges.py"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_otel_stages_providers_and_partners_import_opentelemetry() -> None:
    found = {path.relative_to(SRC).as_posix() for path in (SRC / "eventbus").rglob("*.py")
             if any(name.split(".")[0] in ("opentelemetry", "prometheus_client")
                    for name in imported(path))}
    assert found == OTEL_MODULES


BLOCK_SDK = ("import sys\n"
             "for name in ('opentelemetry.sdk', 'opentelemetry.exporter', 'prometheus_client',"
             " 'opentelemetry.instrumentation.pymongo', 'opentelemetry.instrumentation.requests'):"
             "\n    sys.modules[name] = None\n")
RUN_OFF = """
from eventbus import Router
from eventbus.settings import Settings, SettingsError
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import LocalBus
from eventbus.web.app import create_app
routes = Router()
routes.handler("A")(lambda c: c.emit("B", {}))
routes.handler("B", internal=True)(lambda c: None)
bus = LocalBus(routes)
bus.publish("A", {}, entity={"partnerId": "p", "entity_id": "e", "entity_type": "T"})
assert [r.outcome.value for r in bus.results] == ["processed", "processed"]
assert create_app(routes, Settings(), store=MemoryEventStore()).test_client().get(
    "/health").status_code == 200
try:
    create_app(routes, Settings(telemetry_exporter="noop"), store=MemoryEventStore())
except SettingsError as exc:
    print("refused:", exc)
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk") and sys.modules[m]]
"""


def test_telemetry_off_needs_no_sdk_exporter_or_instrumentation() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCK_SDK + RUN_OFF], capture_output=True,
                          text=True, cwd=SRC.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "refused: telemetry needs the [telemetry] extra" in done.stdout


PRIVATE = re.compile(r"opentelemetry[\w.]*\._\w+|\b_[A-Z_]*(?:SUPPRESS|INSTRUMENTATION)\w*"
                     r"|\._(?:active_span_processor|receive_metrics|commandtracer_instance)\b")


def test_no_private_opentelemetry_name_in_the_library() -> None:
    """A minor SDK release may change a private name: the library uses public API only."""
    used = {f"{path.relative_to(SRC)}: {found}" for path in (SRC / "eventbus").rglob("*.py")
            for found in PRIVATE.findall(path.read_text())}
    assert used == set()


def test_the_telemetry_package_stays_small() -> None:
    # 800, plus the partner gauges (telemetry/partners.py, issue 24).
    lines = sum(len(path.read_text().splitlines())
                for path in (SRC / "eventbus" / "telemetry").glob("*.py"))
    assert lines <= 880
