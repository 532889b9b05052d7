"""Events per second through the real push service, against two baselines measured in the same run.

    .venv/bin/python bench/handler.py [--duration 15] [--slices 3] [--concurrency 16] [--runs 1]

Rows (see bench/README.md):

- ``bare Flask 204``: ``bench/bare_app.py`` under the same gunicorn command and
  ``gunicorn.conf.py`` as the service, posted the same push bodies;
- ``raw pymongo claim+complete``: per event, the claim's ``find_one_and_update``
  upsert and the finishing ``update_one``, straight from pymongo, same concurrency;
- ``handler, telemetry off``: ``main:app`` with the real store and a no-op handler
  (``bench/noop_handlers.py``), every push a new event;
- ``telemetry on, default ratio``: the same app with traces and metrics on
  (``EVENTBUS_TELEMETRY_EXPORTER=noop``, ``EVENTBUS_METRICS_EXPORTER=noop``: spans
  and measurements made, then dropped by a no-op exporter) at the default
  ``EVENTBUS_TRACE_SAMPLE_RATIO``; over telemetry off, target >= 0.90;
- ``telemetry on, ratio 1.0``: the same, every trace kept: tracing's full cost;
- ``handler duplicates``: the same service, re-posting events it already processed;
- ``handler ordered``: the same service and no-op handler declared ``ordered_by``
  (``BENCH_ORDERED``), every push a new event of a new entity (events spread over
  many entities); over telemetry off, target >= 0.8 (bench/README.md);
- ``minimal Flask claim+complete`` (reference): ``bench/minimal_app.py``, the thinnest
  Flask service doing the raw baseline's two round trips per push; what any
  Flask + pymongo service can reach here, so new events over it is the framework's cost.

Load comes from ``--processes`` client processes, each running its share of
``--concurrency`` threads; an HTTP thread keeps one connection alive. Only
answers that complete inside the timed window, and that say what was expected
(204; ``processed``; ``duplicate``; a new claim and a matched finish), count.
Each row's ``--duration`` is cut into ``--slices`` slices taken round-robin
across the rows, so background load on the machine weighs on all rows alike.

``CPU ms/event``: the CPU time (user + sys) the row's service spent per counted
answer: its gunicorn master and workers (the service's process group, including
workers reaped meanwhile), read from ``/proc/<pid>/stat`` at the start and the end
of each timed window (``psutil`` where there is no ``/proc``). Cloud Run bills
CPU, so this is the cost side of the rate. The raw pymongo row has no service.

The database is ``MONGODB_URI`` when set; otherwise the local server of the
``localdb`` tool, started if it is not running and then stopped again at the end
(a server that was already running is left running).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import http.client
import json
import multiprocessing
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the project importable
    sys.path.insert(0, str(ROOT))

from pymongo import MongoClient, ReturnDocument  # noqa: E402
from pymongo.collection import Collection  # noqa: E402

from bench.noop_handlers import EVENT_TYPE, ORDERED_TYPE  # noqa: E402
from eventbus.store import documents  # noqa: E402
from eventbus.store.mongo import INDEXES  # noqa: E402

RAW_COLLECTION = "raw_baseline"
# The telemetry rows: spans and measurements made, exported nowhere (no-op exporters), with
# the default instrumentations; at the default sample ratio, and at 1.0 (every trace kept).
TELEMETRY_ON = {"EVENTBUS_TELEMETRY_EXPORTER": "noop", "EVENTBUS_METRICS_EXPORTER": "noop"}
TELEMETRY_ROWS = {"otel": TELEMETRY_ON,
                  "otel_all": {**TELEMETRY_ON, "EVENTBUS_TRACE_SAMPLE_RATIO": "1.0"}}
TELEMETRY_TARGET = 0.90
"""Telemetry on at the default ratio over off, in events/s (bench/README.md)."""
ORDERED_TARGET = 0.8
"""An ordered no-op handler over the unordered one, in events/s."""
CPU_TARGET = 1.3
"""Handler CPU per event over the minimal Flask app's."""
DUPLICATE_POOL = 20  # events each duplicate-posting thread processes once, then re-posts
PREPARE_TIMEOUT = 120.0  # seconds a client may take to get ready before the run fails
LEASE = timedelta(seconds=60)
RETENTION = timedelta(days=30)
ROWS = ("bare", "raw", "new", "otel", "otel_all", "dup", "ordered", "minimal")
ROW_NAMES = {
    "bare": "bare Flask 204",
    "raw": "raw pymongo claim+complete",
    "new": "handler, telemetry off",
    "otel": "telemetry on, default ratio",
    "otel_all": "telemetry on, ratio 1.0",
    "dup": "handler duplicates",
    "ordered": "handler ordered (ordered_by)",
    "minimal": "minimal Flask claim+complete",
}


# --- what a load phase does ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Load:
    """One timed phase: the kind of work, its target, and how long and wide to run it."""

    kind: str
    """``bare``, ``new``, ``dup`` (HTTP) or ``raw`` (pymongo)."""
    target: str
    """The service's base URL, or the MongoDB URI for ``raw``."""
    db: str
    duration: float
    warmup: float
    threads: int
    """Threads (connections) in each client process."""
    run_id: str
    """Prefix of every key this row sends in one run (duplicates reuse their pool)."""
    piece: int = 0
    """Which slice of the row this is; new keys are unique per slice."""


@dataclasses.dataclass
class Tally:
    """What the threads of one phase saw inside the timed window."""

    ok: int = 0
    unexpected: int = 0
    errors: int = 0
    first_problem: str = ""

    def add(self, other: Tally) -> None:
        """Fold ``other`` into this tally."""
        self.ok += other.ok
        self.unexpected += other.unexpected
        self.errors += other.errors
        self.first_problem = self.first_problem or other.first_problem

    def note(self, problem: str) -> None:
        """Remember the first problem seen, for the report."""
        self.first_problem = self.first_problem or problem


@dataclasses.dataclass(frozen=True)
class Window:
    """The timed window, on the machine-wide monotonic clock."""

    start: float
    end: float

    def counts(self, moment: float) -> bool:
        """True when an answer completed at ``moment`` is inside the window."""
        return self.start <= moment <= self.end


# --- push bodies ----------------------------------------------------------------


def event_document(tag: str, event_type: str = EVENT_TYPE) -> dict[str, Any]:
    """A valid ``BENCH_NOOP`` (or ``BENCH_ORDERED``) event whose entity id is ``tag``."""
    return {
        "event_type": event_type,
        "event_version": "v1",
        "event_direction": "IN",
        "entity_metadata": {"partnerId": "bench", "partnerName": "Bench",
                            "entity_id": tag, "entity_type": "Bench"},
        "entity_data": {"tag": tag, "n": 1},
    }  # fmt: skip


def push_body(tag: str, event_type: str = EVENT_TYPE) -> bytes:
    """The wrapped push body the emulator would send for the event ``tag``."""
    data = base64.b64encode(json.dumps(event_document(tag, event_type)).encode()).decode()
    attributes = {"event_type": event_type, "event_version": "v1", "idempotency_key": tag}
    message = {"data": data, "messageId": tag, "publishTime": "2026-11-22T10:00:00.000Z",
               "attributes": attributes}  # fmt: skip
    return json.dumps(
        {"message": message, "subscription": "projects/local-project/subscriptions/bench"}
    ).encode()


def expected_answer(kind: str) -> Callable[[int, bytes], bool]:
    """The check an answer must pass to count for ``kind``."""
    if kind == "bare":
        return lambda status, _: status == 204
    word = b'"duplicate"' if kind == "dup" else b'"processed"'
    return lambda status, body: status == 200 and word in body


# --- HTTP load ------------------------------------------------------------------


def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes]:
    """POST one push body on a kept-alive connection; the status and body."""
    conn.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def bodies_for(load: Load, thread: str) -> Iterator[bytes]:
    """Endless push bodies: new events, or this thread's processed pool again and again."""
    if load.kind == "dup":
        pool = [push_body(f"{load.run_id}-dup-{thread}-{i}") for i in range(DUPLICATE_POOL)]
        while True:
            yield from pool
    counter = 0
    event_type = ORDERED_TYPE if load.kind == "ordered" else EVENT_TYPE
    while True:
        counter += 1
        yield push_body(f"{load.run_id}-{load.piece}-{load.kind}-{thread}-{counter}", event_type)


def process_pool_once(conn: http.client.HTTPConnection, load: Load, thread: str) -> None:
    """Before timing duplicates: get this thread's pool processed (retrying 503s)."""
    for i in range(DUPLICATE_POOL):
        body = push_body(f"{load.run_id}-dup-{thread}-{i}")
        for _ in range(50):
            status, _ = post(conn, body)
            if status == 200:
                break
            time.sleep(0.05)


def http_thread(load: Load, thread: str, start: Start) -> Tally:
    """Post bodies on one connection until the window ends; count what completes inside it."""
    host, port = load.target.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    tally, check = Tally(), expected_answer(load.kind)
    if load.kind == "dup":
        try:
            process_pool_once(conn, load, thread)
        except (OSError, http.client.HTTPException) as exc:
            tally.errors += 1
            tally.note(f"preparing duplicates: {type(exc).__name__}: {exc}")
    window = start.wait()
    for body in bodies_for(load, thread):
        if time.monotonic() >= window.end:
            break
        try:
            status, answer = post(conn, body)
        except (OSError, http.client.HTTPException) as exc:
            tally.errors += 1
            tally.note(f"{type(exc).__name__}: {exc}")
            conn.close()
            continue
        if window.counts(time.monotonic()):
            good = check(status, answer)
            tally.ok += good
            tally.unexpected += not good
            if not good:
                tally.note(f"{status} {answer[:200]!r}")
    conn.close()
    return tally


# --- raw pymongo load -------------------------------------------------------------


def raw_claim_and_complete(collection: Collection, tag: str) -> bool:
    """The store's two round trips for a new event, sent straight from pymongo."""
    now, owner = datetime.now(UTC), uuid.uuid4().hex
    fields = {**event_document(tag), "pubsub": {"messageId": tag, "form": "wrapped"}}
    claim = documents.claim_pipeline(fields, now, owner=owner, lease=LEASE, created_by="bench",
                                     retention=RETENTION)  # fmt: skip
    before = collection.find_one_and_update(documents.key_filter(tag), claim, upsert=True,
                                            return_document=ReturnDocument.BEFORE)  # fmt: skip
    done = collection.update_one(documents.owner_filter(tag, owner),
                                 documents.succeed_update(now))
    return before is None and done.matched_count == 1


def raw_thread(collection: Collection, load: Load, thread: str, start: Start) -> Tally:
    """Claim and complete new events until the window ends; count what completes inside it."""
    tally, counter = Tally(), 0
    window = start.wait()
    while time.monotonic() < window.end:
        counter += 1
        try:
            tag = f"{load.run_id}-{load.piece}-raw-{thread}-{counter}"
            good = raw_claim_and_complete(collection, tag)
        except Exception as exc:  # counted and reported, never hidden
            tally.errors += 1
            tally.note(f"{type(exc).__name__}: {exc}")
            continue
        if window.counts(time.monotonic()):
            tally.ok += good
            tally.unexpected += not good
    return tally


def mongo_client(uri: str) -> MongoClient:
    """A client configured like the service's store client (minus its command listener)."""
    return MongoClient(uri, tz_aware=True, appname="bench", serverSelectionTimeoutMS=5000,
                       connectTimeoutMS=5000, socketTimeoutMS=5000)  # fmt: skip


# --- client processes -------------------------------------------------------------


class Start:
    """Holds a process's threads until all are ready, then hands each the timed window.

    The window is chosen by the parent process once every client process is
    ready, so it can sample the service's CPU time at the window's edges.
    """

    def __init__(self, threads: int) -> None:
        self._ready = threading.Barrier(threads + 1, timeout=PREPARE_TIMEOUT)
        self._go = threading.Event()
        self._window: Window | None = None

    def wait(self) -> Window:
        """Called by a thread once it is prepared: block until the window is set."""
        self._ready.wait()
        self._go.wait(timeout=PREPARE_TIMEOUT)
        if self._window is None:
            raise RuntimeError("the timed window never opened")
        return self._window

    def open(self, index: int, ready: Any, go: Any, window: Any) -> None:
        """Called by the process: its threads are prepared; report ready, take the window."""
        self._ready.wait()
        ready.put(index)
        if not go.wait(timeout=PREPARE_TIMEOUT):
            raise RuntimeError("the parent never opened the timed window")
        self._window = Window(window[0], window[1])
        self._go.set()


def client_process(load: Load, index: int, ready: Any, go: Any, window: Any,
                   results: Any) -> None:  # fmt: skip
    """One client process: its threads prepare, wait together, then run the timed window."""
    client = mongo_client(load.target) if load.kind == "raw" else None
    start = Start(load.threads)
    tallies: list[Tally] = []

    def work(n: int) -> None:
        thread = f"{index}.{n}"
        if client is not None:
            tallies.append(raw_thread(client[load.db][RAW_COLLECTION], load, thread, start))
        else:
            tallies.append(http_thread(load, thread, start))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(load.threads)]
    for thread in threads:
        thread.start()
    start.open(index, ready, go, window)
    for thread in threads:
        thread.join()
    total = Tally()
    for tally in tallies:
        total.add(tally)
    results.put(dataclasses.asdict(total))
    if client is not None:
        client.close()


def run_load(load: Load, processes: int, service: int | None = None) -> tuple[Tally, float | None]:
    """Run ``load`` in ``processes`` client processes; their tallies added up.

    Also returns the CPU seconds that the service whose gunicorn master is
    ``service`` (None: no service) spent inside the timed window.
    """
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Queue(), context.Event(), context.Queue()
    window = context.Array("d", 2)
    workers = [context.Process(target=client_process, args=(load, i, ready, go, window, results))
               for i in range(processes)]  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        wait_ready(ready, workers, time.monotonic() + PREPARE_TIMEOUT)
        start = time.monotonic() + load.warmup
        window[0], window[1] = start, start + load.duration
        go.set()
        cpu = window_cpu(service, start, start + load.duration)
        return collect(results, workers, time.monotonic() + PREPARE_TIMEOUT + 60), cpu
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join()


def wait_ready(ready: Any, workers: Sequence[Any], deadline: float) -> None:
    """Wait until every client process is prepared; fail fast when one died first."""
    count = 0
    while count < len(workers):
        try:
            ready.get(timeout=1)
            count += 1
            continue
        except queue.Empty:
            pass
        codes = [worker.exitcode for worker in workers]
        if any(code is not None for code in codes):
            raise RuntimeError(f"a client process exited before it was ready: exit codes {codes}")
        if time.monotonic() > deadline:
            raise RuntimeError("client processes were not ready in time")


# --- the service's CPU time -------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def group_cpu_seconds(pgid: int) -> float:
    """User + sys CPU seconds of process group ``pgid`` so far: gunicorn's master and workers.

    Each member's own time plus the time of the children it reaped, so a
    worker that exited (its time moves to the master's ``cutime``/``cstime``)
    still counts, once. From ``/proc/<pid>/stat``, or psutil without ``/proc``.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return _psutil_group_cpu(pgid)
    ticks = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command name (which may hold spaces and parentheses):
            # state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
            # utime stime cutime cstime ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid:
            ticks += sum(int(value) for value in fields[11:15])
    return ticks / _CLOCK_TICKS


def _psutil_group_cpu(pgid: int) -> float:
    import psutil  # only where there is no /proc

    root = psutil.Process(pgid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def window_cpu(service: int | None, start: float, end: float) -> float | None:
    """Sample the service's CPU time at ``start`` and ``end`` (monotonic); the difference."""
    if service is None:
        return None
    time.sleep(max(0.0, start - time.monotonic()))
    before = group_cpu_seconds(service)
    time.sleep(max(0.0, end - time.monotonic()))
    return group_cpu_seconds(service) - before


def collect(results: Any, workers: Sequence[Any], deadline: float) -> Tally:
    """Add up one tally per worker; fail fast when a worker died without sending one."""
    total, received = Tally(), 0
    while received < len(workers):
        try:
            total.add(Tally(**results.get(timeout=1)))
            received += 1
            continue
        except queue.Empty:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("client processes did not report in time")
        if sum(worker.exitcode is not None for worker in workers) > received and results.empty():
            time.sleep(1)  # a worker that just exited may still be flushing its result
            if results.empty():
                codes = [worker.exitcode for worker in workers]
                raise RuntimeError(f"a client process died without a result: exit codes {codes}")
    return total


# --- services, database, the table -----------------------------------------------


@contextlib.contextmanager
def database() -> Iterator[str]:
    """Yield ``MONGODB_URI`` if set, else the local server's URI.

    The local server (the ``localdb`` tool) is started when it does not
    answer, and then stopped at the end; one that already answered is left
    running, as are servers that ``MONGODB_URI`` names.
    """
    if os.environ.get("MONGODB_URI"):
        yield os.environ["MONGODB_URI"]
        return
    from localdb import LocalDBError, ensure_started, status, stop

    try:
        was_up = status().up
        uri = ensure_started()
    except LocalDBError as exc:  # one line saying what failed and what to do
        raise SystemExit(f"bench/handler.py: {exc}") from None
    try:
        yield uri
    finally:
        if not was_up:
            for message in stop():
                print(f"bench/handler.py: localdb: {message}", file=sys.stderr)


def redact(uri: str) -> str:
    """``uri`` without its password."""
    return re.sub(r"(//[^:/@]*):[^@/]*@", r"\1:***@", uri)


@contextlib.contextmanager
def services(uri: str, db: str, logs: Path,
             app: str) -> Iterator[tuple[dict[str, str], dict[str, int]]]:  # fmt: skip
    """Start the apps under the same gunicorn (the handler app once per telemetry setting).

    Yield each row's target (URL, or the MongoDB URI for ``raw``) and the pid of
    each HTTP row's gunicorn master (which leads the service's process group).
    """
    from tests.e2e.harness import ServiceProcess

    env = {"MONGODB_URI": uri, "MONGODB_DB": db, "EVENTBUS_HANDLER_MODULES": "bench.noop_handlers",
           "EVENTBUS_RELAY_INLINE": "false"}  # fmt: skip
    apps = {"bare": ("bench.bare_app:app", {}), "new": (app, {}),
            "minimal": ("bench.minimal_app:app", {}),
            **{row: (app, extra) for row, extra in TELEMETRY_ROWS.items()}}  # fmt: skip
    started: dict[str, ServiceProcess] = {}
    try:
        for name, (target, extra) in apps.items():
            started[name] = ServiceProcess(logs / f"{name}.log", app=target,
                                           env={**env, **extra})  # fmt: skip
            started[name].start()
        started["dup"] = started["new"]  # duplicates go to the new-events service
        started["ordered"] = started["new"]  # so do ordered events (their own handler)
        targets = {"raw": uri, **{row: service.url for row, service in started.items()}}
        masters = {row: service.process.pid for row, service in started.items()
                   if service.process is not None}  # fmt: skip
        yield targets, masters
    finally:
        for name, service in reversed(started.items()):
            if name not in ("dup", "ordered"):
                service.stop()


def prepare_raw_collection(uri: str, db: str) -> None:
    """Give the raw baseline's collection the same indexes as ``partner_events``."""
    with contextlib.closing(mongo_client(uri)) as client:
        client[db][RAW_COLLECTION].create_indexes(list(INDEXES))


@dataclasses.dataclass(frozen=True)
class Options:
    """The command line."""

    duration: float
    warmup: float
    concurrency: int
    processes: int
    runs: int
    slices: int
    app: str


@dataclasses.dataclass
class RowResult:
    """One row of one run: answers counted, the rate, and the service's CPU time."""

    tally: Tally
    rate: float
    cpu: float | None
    """CPU seconds the row's service spent in its timed windows; None without a service."""

    @property
    def cpu_ms_per_event(self) -> float | None:
        """Milliseconds of service CPU per counted answer."""
        if self.cpu is None or not self.tally.ok:
            return None
        return 1000 * self.cpu / self.tally.ok


def measure_all(options: Options, targets: dict[str, str], masters: dict[str, int], db: str,
                run: int) -> dict[str, RowResult]:  # fmt: skip
    """One run: every row, in round-robin slices; ops/s, tally and CPU of each.

    Each row's time is cut into ``options.slices`` slices taken in turn
    (bare, raw, new, dup, bare, ...), so a burst of other work on the
    machine, or the collection growing, weighs on every row alike.
    """
    threads = max(1, options.concurrency // options.processes)
    seconds = options.duration / options.slices
    run_ids = {kind: f"r{run}-{uuid.uuid4().hex[:6]}" for kind in ROWS}
    tallies = {kind: Tally() for kind in ROWS}
    cpu: dict[str, float | None] = {kind: None for kind in ROWS}
    for piece in range(options.slices):
        for kind in ROWS:
            load = Load(kind, targets[kind], db, seconds, options.warmup, threads,
                        run_id=run_ids[kind], piece=piece)  # fmt: skip
            tally, spent = run_load(load, options.processes, masters.get(kind))
            tallies[kind].add(tally)
            if spent is not None:
                cpu[kind] = (cpu[kind] or 0.0) + spent
    return {kind: RowResult(tally, tally.ok / options.duration, cpu[kind])
            for kind, tally in tallies.items()}  # fmt: skip


def ratios(rates: dict[str, float]) -> dict[str, float]:
    """Each row's rate divided by the slower of the two baselines."""
    slower = min(rates["bare"], rates["raw"])
    return {kind: (rate / slower if slower else 0.0) for kind, rate in rates.items()}


def cpu_cell(ms: float | None) -> str:
    """The CPU column's cell: ms per event, or a dash for a row without a service."""
    return "-" if ms is None else f"{ms:.2f}"


HEADER = f"{'row':<30}{'ops/s':>10}{'vs slower baseline':>20}{'CPU ms/event':>14}"


def print_run(run: int, results: dict[str, RowResult]) -> None:
    """Print one run's table, with unexpected answers and errors."""
    rates = {kind: row.rate for kind, row in results.items()}
    print(f"\nrun {run + 1}")
    print(f"{HEADER}{'unexpected':>12}{'errors':>8}")
    for kind, ratio in ratios(rates).items():
        row = results[kind]
        print(f"{ROW_NAMES[kind]:<30}{row.rate:>10.1f}{ratio:>20.2f}"
              f"{cpu_cell(row.cpu_ms_per_event):>14}"
              f"{row.tally.unexpected:>12}{row.tally.errors:>8}")  # fmt: skip
        if row.tally.first_problem:
            print(f"    first problem: {row.tally.first_problem}")
    cpu_ms = {kind: row.cpu_ms_per_event for kind, row in results.items()}
    print(gap_split(quotients(rates, cpu_ms), cpu_ms))
    sys.stdout.flush()


def quotients(rates: dict[str, float], cpu_ms: dict[str, float | None]) -> dict[str, float]:
    """The quotients that split the gap to raw pymongo, from one run's figures.

    ``framework``: handler new / minimal Flask ops/s; ``http``: minimal Flask /
    raw pymongo ops/s; ``cpu``: handler new / minimal Flask CPU per event;
    ``<row>/new`` and ``<row>/new cpu``: a telemetry row over telemetry off, ops/s and CPU.
    A quotient whose divisor measured nothing is left out.
    """
    found = {}
    if rates["minimal"]:
        found["framework"] = rates["new"] / rates["minimal"]
    if rates["raw"]:
        found["http"] = rates["minimal"] / rates["raw"]
    new, minimal = cpu_ms.get("new"), cpu_ms.get("minimal")
    if new and minimal:
        found["cpu"] = new / minimal
    if rates["new"]:
        found["ordered/new"] = rates["ordered"] / rates["new"]
    for row in TELEMETRY_ROWS:
        if rates["new"]:
            found[f"{row}/new"] = rates[row] / rates["new"]
        if new and cpu_ms.get(row):
            found[f"{row}/new cpu"] = (cpu_ms[row] or 0.0) / new
    return found


def gap_split(split: dict[str, float], cpu_ms: dict[str, float | None]) -> str:
    """Lines splitting the gap to raw pymongo into the framework's part and HTTP's part."""
    if "framework" not in split or "http" not in split:
        return ("(a reference row measured nothing: no split of the gap)"
                + telemetry_line(split, cpu_ms))
    lines = (
        f"handler new / minimal Flask = {split['framework']:.2f} (the framework); "
        f"minimal Flask / raw pymongo = {split['http']:.2f} "
        "(gunicorn + Flask + HTTP on this machine)"
    )
    if "cpu" in split:
        verdict = "meets" if split["cpu"] <= CPU_TARGET else "MISSES"
        lines += (f"\nservice CPU per event: handler new / minimal Flask = {split['cpu']:.2f} "
                  f"({cpu_ms['new']:.2f} ms vs {cpu_ms['minimal']:.2f} ms; {verdict} the "
                  f"target <= {CPU_TARGET})")
    return lines + telemetry_line(split, cpu_ms)


def telemetry_line(split: dict[str, float], cpu_ms: dict[str, float | None]) -> str:
    """The telemetry's overhead: ops/s with traces and metrics on (no-op exporters) over off;
    and per-entity order's: the ordered no-op over the unordered one."""
    lines = ""
    if "ordered/new" in split:
        verdict = "meets" if split["ordered/new"] >= ORDERED_TARGET else "MISSES"
        lines += (f"\n{ROW_NAMES['ordered']} / telemetry off = {split['ordered/new']:.3f} ops/s "
                  f"({verdict} the target >= {ORDERED_TARGET})")
    for row in TELEMETRY_ROWS:
        if f"{row}/new" not in split:
            lines += f"\n(no {ROW_NAMES[row]!r} ratio: the telemetry-off row measured nothing)"
            continue
        ratio = split[f"{row}/new"]
        lines += f"\n{ROW_NAMES[row]} / telemetry off = {ratio:.3f} ops/s"
        if row == "otel":
            verdict = "meets" if ratio >= TELEMETRY_TARGET else "MISSES"
            lines += f" ({verdict} the target >= {TELEMETRY_TARGET})"
        if f"{row}/new cpu" in split:
            lines += (f"; CPU per event {split[f'{row}/new cpu']:.3f}x "
                      f"({cpu_ms[row] or 0:.2f} ms vs {cpu_ms['new'] or 0:.2f} ms)")
    return lines


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None; None when there are none."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def print_median(runs: Sequence[dict[str, RowResult]]) -> None:
    """Print the median ops/s, ratio and CPU per event of each row over the runs.

    Like the ratio column, the quotients under the table are medians of each
    run's own quotients (rows measured side by side), not quotients of medians
    taken from different runs.
    """
    per_run = [{kind: row.rate for kind, row in run.items()} for run in runs]
    per_run_cpu = [{kind: row.cpu_ms_per_event for kind, row in run.items()} for run in runs]
    print(f"\nmedian of {len(runs)} runs")
    print(HEADER)
    cpu = {kind: median_or_none([run[kind] for run in per_run_cpu]) for kind in ROWS}
    for kind in ROWS:
        rate = statistics.median(rates[kind] for rates in per_run)
        ratio = statistics.median(ratios(rates)[kind] for rates in per_run)
        print(f"{ROW_NAMES[kind]:<30}{rate:>10.1f}{ratio:>20.2f}{cpu_cell(cpu[kind]):>14}")
    splits = [quotients(rates, cpu_ms) for rates, cpu_ms in zip(per_run, per_run_cpu, strict=True)]
    split = {name: statistics.median(found[name] for found in splits if name in found)
             for name in {name for found in splits for name in found}}
    print(gap_split(split, cpu))


def parse_args(argv: Sequence[str] | None) -> Options:
    """Read the command line into ``Options``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=15.0, help="timed seconds per row")
    parser.add_argument("--warmup", type=float, default=1.0, help="untimed seconds per slice")
    parser.add_argument("--slices", type=int, default=3,
                        help="slices per row, taken round-robin across the rows")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=16,
                        help="connections (or pymongo threads) in all")  # fmt: skip
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--runs", type=int, default=1, help="repeat; >1 adds a median table")
    parser.add_argument(
        "--app",
        default="main:app",
        help="WSGI app of the handler rows, to compare a variant of the service",
    )
    args = parser.parse_args(argv)
    return Options(args.duration, args.warmup, args.concurrency, args.processes, args.runs,
                   max(1, args.slices), args.app)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables."""
    options = parse_args(argv)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    runs: list[dict[str, RowResult]] = []
    with database() as uri:
        print(
            f"bench/handler.py: {options.duration:g} s per row in {options.slices} slices, "
            f"each after {options.warmup:g} s warm-up; "
            f"{options.concurrency} connections over {options.processes} client processes; "
            f"gunicorn.conf.py for every service; handler app {options.app}; "
            f"MongoDB {redact(uri)}, database {db}"
        )
        sys.stdout.flush()
        try:
            prepare_raw_collection(uri, db)
            with tempfile.TemporaryDirectory(prefix="bench-handler-") as logs, \
                    services(uri, db, Path(logs), options.app) as (targets, masters):  # fmt: skip
                for run in range(options.runs):
                    runs.append(measure_all(options, targets, masters, db, run))
                    print_run(run, runs[-1])
        finally:
            with contextlib.closing(mongo_client(uri)) as client:
                client.drop_database(db)
    if len(runs) > 1:
        print_median(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
