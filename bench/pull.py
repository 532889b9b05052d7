"""The pull worker against the push path and the store's own ceiling, measured in one run.

    .venv/bin/python bench/pull.py [--events 2000] [--runs 3] [--sizes 1,10,100,500] [--quick]

Rows (one store: ``MONGODB_URI``, else the local server of the ``localdb`` tool):

- ``push (bench/handler.py)``: ``handler, telemetry off`` of ``bench/handler.py``
  (gunicorn, 16 connections; its CPU is the service's), run as a subprocess;
  a push costs two store round trips per event by construction;
- ``worker, in-process, batch B``: the real ``Processor.run`` and ``PullWorker``
  over the real ``MongoEventStore`` with no-op handlers (``bench/noop_handlers.py``),
  messages from an in-process source: the worker's ceiling. CPU is this
  process's (the worker's); round trips are the store's own command count;
- ``worker, emulator, batch B``: ``python -m eventbus worker`` as a subprocess
  draining messages published to the emulator first: end to end. CPU is the
  subprocess's (``/proc``), over the time it took to drain;
- ``worker ordered, in-process, batch B`` (B >= 100): the same with the no-op
  handler declared ``ordered_by``, every event its own entity: per-entity order's
  extra round trips (target <= 0.05 per event) and events/s over the unordered
  row (target >= 0.9);
- ``raw pymongo, batch B``: the same write shapes straight from pymongo, no
  framework: an unordered insert of the new records, a ``find`` of the keys,
  an unordered bulk finish. The store's ceiling for those shapes.

Ratios: worker CPU per event over push's (target at batch 100 <= 1/3), round
trips per event (target < 0.05), worker events/s over raw at the same batch
size (target >= 0.8). Medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from pymongo import InsertOne, MongoClient, UpdateOne, monitoring  # noqa: E402

from eventbus.processor import Processor  # noqa: E402
from eventbus.settings import Settings  # noqa: E402
from eventbus.store import documents  # noqa: E402
from eventbus.store.mongo import MongoEventStore  # noqa: E402
from eventbus.store.roundtrips import IGNORED_COMMANDS  # noqa: E402
from eventbus.testing import FakeClock  # noqa: E402
from eventbus.workers.pull import Inbox, PullWorker  # noqa: E402

LEASE = timedelta(seconds=60)


class Commands(monitoring.CommandListener):
    """Every command any thread of this process sends (handler threads and heartbeats too)."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        """Count ``event`` unless it is the driver's own traffic."""
        if event.command_name not in IGNORED_COMMANDS:
            self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        """Nothing to count."""

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        """Nothing to count."""


# Registered before any client exists, so every client of this process reports to it.
COMMANDS = Commands()
monitoring.register(COMMANDS)


@dataclass
class Row:
    """One measurement: events/s, CPU µs per event of the serving process, round trips/event."""

    name: str
    rate: float
    cpu_us: float | None
    trips: float | None


class Message:
    """An in-process pulled message: acks and nacks cost nothing."""

    def __init__(self, n: int, tag: str, event_type: str = "BENCH_NOOP") -> None:
        body = {"event_type": event_type, "event_version": "v1",
                "entity_metadata": {"partnerId": "bench", "entity_id": f"e-{n}",
                                    "entity_type": "Bench"}, "entity_data": {"n": n}}
        self.data = json.dumps(body).encode()
        self.attributes = {"idempotency_key": f"{tag}-{n}"}
        self.message_id, self.ordering_key, self.delivery_attempt = f"m-{n}", "", 1

    def ack(self) -> None:
        """Nothing to tell anyone."""

    def nack(self) -> None:
        """Nothing to tell anyone."""

    def ack_with_response(self) -> Any:
        """Not used: the bench subscription is not exactly-once."""
        raise NotImplementedError


def database_uri() -> str:
    """``MONGODB_URI``, else the localdb tool's server (started if needed)."""
    if os.environ.get("MONGODB_URI"):
        return os.environ["MONGODB_URI"]
    sys.path.insert(0, str(ROOT / "infra" / "localdb" / "src"))
    from localdb import ensure_started

    return str(ensure_started())


def noop_router() -> Any:
    """The bench's no-op handler (``BENCH_NOOP``), as ``bench/handler.py`` uses."""
    sys.path.insert(0, str(ROOT))
    from bench.noop_handlers import routes

    return routes


@contextmanager
def fresh_store(uri: str, db: str) -> Iterator[MongoEventStore]:
    """A ``MongoEventStore`` on a new collection (indexes made), dropped afterwards."""
    settings = Settings(mongodb_uri=uri, mongodb_db=db, collection=f"pull_{uuid.uuid4().hex[:8]}",
                        lease_seconds=LEASE.total_seconds())
    store = MongoEventStore.from_settings(settings)
    store.ensure_indexes()
    try:
        yield store
    finally:
        store.collection.drop()
        store.close()


def worker_in_process(uri: str, db: str, size: int, events: int, ordered: bool = False) -> Row:
    """The worker's ceiling: batches of ``size`` from an in-process source.

    ``ordered``: the no-op handler declared ``ordered_by`` (``BENCH_ORDERED``), each
    event of its own entity (events spread over many entities).
    """
    event_type = "BENCH_ORDERED" if ordered else "BENCH_NOOP"
    name = "worker ordered" if ordered else "worker"
    with fresh_store(uri, db) as store:
        return run_worker(store, size, events, event_type,
                          f"{name}, in-process, batch {size}")


def run_worker(store: MongoEventStore, size: int, events: int, event_type: str,
               name: str) -> Row:
    """``events`` in-process messages through the real ``PullWorker`` over ``store`` (stored
    SUCCESS), in batches of ``size``; the first batch warms up and is not timed."""
    processor = Processor(store, noop_router(), Settings(relay_inline=False),
                          FakeClock(datetime.now(UTC)))
    worker = PullWorker(processor, Inbox(), subscription="bench", batch_size=size)
    tag = uuid.uuid4().hex[:6]
    batches = [[Message(n, tag, event_type) for n in range(i, min(i + size, events))]
               for i in range(0, events, size)]
    worker.run_batch(batches[0])  # warm-up: imports, connections
    before, cpu, wall = COMMANDS.count, time.process_time(), time.perf_counter()
    for batch in batches[1:]:
        worker.run_batch(batch)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = events - len(batches[0])
    assert worker.counters.acked == events, worker.counters
    return Row(name, done / wall, cpu / done * 1e6, (COMMANDS.count - before) / done)


def raw_ceiling(uri: str, db: str, size: int, events: int) -> Row:
    """The same write shapes straight from pymongo: bulk claim, find, bulk finish."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    collection = client[db][f"raw_{uuid.uuid4().hex[:8]}"]
    from eventbus.store.mongo import INDEXES

    collection.create_indexes(list(INDEXES))
    tag, trips = uuid.uuid4().hex[:6], 0
    try:
        started = time.perf_counter()
        for first in range(0, events, size):
            keys = [f"{tag}-{n}" for n in range(first, min(first + size, events))]
            trips += _raw_batch(collection, keys)
        wall = time.perf_counter() - started
    finally:
        collection.drop()
        client.close()
    return Row(f"raw pymongo, batch {size}", events / wall, None, trips / events)


def _raw_batch(collection: Any, keys: list[str]) -> int:
    now, owner = documents.bson_time(datetime.now(UTC)), uuid.uuid4().hex
    fields = {"event_type": "BENCH_NOOP", "payload_fingerprint": "f"}
    collection.bulk_write([InsertOne(documents.new_record(
        key, fields, now, owner=owner, lease=LEASE, created_by="bench",
        retention=timedelta(days=30))) for key in keys], ordered=False)
    list(collection.find({"idempotency_key": {"$in": keys}}, {"idempotency_key": 1}))
    collection.bulk_write([UpdateOne(documents.owner_filter(key, owner),
                                     documents.succeed_update(now)) for key in keys],
                          ordered=False)
    return 3


def push_row(quick: bool) -> Row:
    """``handler, telemetry off`` from ``bench/handler.py`` (a subprocess, its own services)."""
    duration = "4" if quick else "8"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "handler.py"),
                           "--duration", duration, "--runs", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("handler, telemetry off")),
                None)
    if line is None:
        raise SystemExit(f"bench/handler.py gave no 'handler, telemetry off' row:\n{done.stdout}"
                         f"\n{done.stderr[-2000:]}")
    numbers = re.findall(r"[\d.]+", line.removeprefix("handler, telemetry off"))
    return Row("push (bench/handler.py)", float(numbers[0]), float(numbers[2]) * 1000, 2.0)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_through_emulator(uri: str, db: str, size: int, events: int, host: str) -> Row:
    """``python -m eventbus worker`` draining ``events`` published to the emulator first."""
    sys.path.insert(0, str(ROOT))
    from google.pubsub_v1 import types

    from infra.pubsub.resources import Admin

    admin, topic = Admin(host, "local-project"), f"bench-pull-{uuid.uuid4().hex[:6]}"
    admin.ensure_topic(topic)
    admin.ensure_pull_subscription(f"{topic}-pull", topic, ack_deadline=60)
    tag = uuid.uuid4().hex[:6]
    for first in range(0, events, 500):
        admin.publisher.publish(topic=admin.topic_path(topic), messages=[
            types.PubsubMessage(data=m.data, attributes=m.attributes)
            for m in (Message(n, tag) for n in range(first, min(first + 500, events)))],
            timeout=30)
    collection = f"emu_{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "MONGODB_URI": uri, "MONGODB_DB": db, "EVENTBUS_COLLECTION": collection,
           "PUBSUB_EMULATOR_HOST": host, "GOOGLE_CLOUD_PROJECT": "local-project",
           "PUBSUB_TOPIC": topic, "EVENTBUS_HANDLER_MODULES": "bench.noop_handlers",
           "EVENTBUS_RELAY_INLINE": "false", "LOG_LEVEL": "WARNING"}
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        return _drain(env, size, events, client[db][collection], f"{topic}-pull")
    finally:
        client[db].drop_collection(collection)
        client.close()
        admin.delete_subscription(f"{topic}-pull")
        admin.delete_topic(topic)
        admin.close()


def _drain(env: dict[str, str], size: int, events: int, collection: Any, sub: str) -> Row:
    worker = subprocess.Popen([sys.executable, "-m", "eventbus", "worker", "--subscription", sub,
                               "--batch-size", str(size), "--max-messages", str(4 * size)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: collection.estimated_document_count() > 0, 60)
        cpu, started = proc_cpu_seconds(worker.pid), time.perf_counter()
        _wait(lambda: collection.count_documents({"event_status": "SUCCESS"}) >= events, 600)
        wall, cpu = time.perf_counter() - started, proc_cpu_seconds(worker.pid) - cpu
    finally:
        worker.terminate()
        worker.wait(30)
    return Row(f"worker, emulator, batch {size}", events / wall, cpu / events * 1e6, None)


def _wait(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not drain the subscription in time")
        time.sleep(0.05)


@contextmanager
def emulator() -> Iterator[str | None]:
    """A Pub/Sub emulator on a free port for the bench (None when it cannot start)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home = tempfile.mkdtemp(prefix="bench-pubsub-")
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": f"127.0.0.1:{port}", "PUBSUB_EMULATOR_HOME": home,
           "PUBSUB_CREATE_RESOURCES": "0"}
    script = str(ROOT / "pubsub-emulator.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True,
                             timeout=180)
    try:
        yield f"127.0.0.1:{port}" if started.returncode == 0 else None
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


def measure(args: argparse.Namespace, uri: str, db: str, host: str | None) -> list[Row]:
    """One run: every row."""
    rows = [push_row(args.quick)]
    for size in args.sizes:
        rows.append(worker_in_process(uri, db, size, max(args.events, 2 * size)))
    for size in [s for s in args.sizes if s >= 100]:
        rows.append(worker_in_process(uri, db, size, max(args.events, 2 * size), ordered=True))
    if host is not None:
        for size in [s for s in args.sizes if s >= 10]:
            rows.append(worker_through_emulator(uri, db, size, args.events, host))
    for size in args.sizes:
        rows.append(raw_ceiling(uri, db, size, max(args.events, 2 * size)))
    return rows


def median_rows(runs: list[list[Row]]) -> list[Row]:
    """Each row's median over the runs."""
    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return [Row(group[0].name, med([r.rate for r in group]) or 0.0,
                med([r.cpu_us for r in group]), med([r.trips for r in group]))
            for group in zip(*runs, strict=True)]


def table(rows: list[Row]) -> str:
    """The rows as a markdown table, with the ratios to the push row and the raw rows."""
    push = rows[0]
    raw = {r.name.rsplit(" ", 1)[1]: r.rate for r in rows if r.name.startswith("raw")}
    out = ["| row | events/s | CPU µs/event | vs push CPU | round trips/event | vs raw events/s |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = f"{r.cpu_us:.0f}" if r.cpu_us is not None else "-"
        vs_push = f"{r.cpu_us / push.cpu_us:.2f}" if r.cpu_us and push.cpu_us else "-"
        size = r.name.rsplit(" ", 1)[1]
        vs_raw = f"{r.rate / raw[size]:.2f}" if r.name.startswith("worker") and size in raw \
            else "-"
        trips = f"{r.trips:.3f}" if r.trips is not None else "-"
        out.append(f"| {r.name} | {r.rate:.0f} | {cpu} | {vs_push} | {trips} | {vs_raw} |")
    return "\n".join(out + ordered_lines(rows))


def ordered_lines(rows: list[Row]) -> list[str]:
    """Per-entity order's cost at each batch size: events/s ratio and extra round trips."""
    plain = {r.name.rsplit(" ", 1)[1]: r for r in rows if r.name.startswith("worker, in-")}
    lines = []
    for r in rows:
        base = plain.get(r.name.rsplit(" ", 1)[1])
        if r.name.startswith("worker ordered") and base is not None and base.rate:
            extra = (r.trips or 0.0) - (base.trips or 0.0)
            lines.append(f"\nordered / unordered at {r.name.rsplit(' ', 1)[1]}: "
                         f"{r.rate / base.rate:.2f} events/s (target >= 0.9), "
                         f"{extra:+.3f} round trips per event (target <= 0.05)")
    return lines


def main() -> None:
    """Parse, measure ``--runs`` times, print the median table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1, 10, 100, 500])
    parser.add_argument("--quick", action="store_true", help="500 events, one run")
    args = parser.parse_args()
    if args.quick:
        args.events, args.runs = 500, 1
    uri, db = database_uri(), f"bench_pull_{uuid.uuid4().hex[:6]}"
    runs = []
    with emulator() as host:
        for n in range(args.runs):
            print(f"run {n + 1}/{args.runs}", file=sys.stderr, flush=True)
            runs.append(measure(args, uri, db, host))
            print(table(runs[-1]), file=sys.stderr, flush=True)
    MongoClient(uri).drop_database(db)
    print(f"\nmedian of {args.runs} runs, {args.events} events per row"
          f"{'' if host else ' (no emulator: end-to-end rows left out)'}")
    print(table(median_rows(runs)))


if __name__ == "__main__":
    main()
