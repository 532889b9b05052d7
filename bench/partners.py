"""One partner down (or slow) for a while, one healthy: what the healthy one notices, through
push and pull.

    .venv/bin/python bench/partners.py [--runs 3] [--phase 15] [--down hang|503|slow] [--quick]

Two partners behind a local HTTP server: ``healthy`` answers 204 at once;
``flaky`` answers 204 too, except during the *down* phase, when it hangs past
the call's deadline (``--down hang``, the default: a partner that times out)
or answers 503 at once (``--down 503``), or answers 204 after ``SLOW`` seconds,
under its deadline (``--down slow``: issue 32's 8 s partner, times scaled down
by 10: 0.8 s answers, a 2 s deadline, slow from 0.4 s). Events alternate between the two.
The handler is the partner app's own call (``bench/partner_handlers.py``:
guard, breaker, deadline) on the real store (``MONGODB_URI``, else the local
server of the ``localdb`` tool, a throwaway database).

Each scenario runs three phases of ``--phase`` seconds: both healthy, flaky
down, flaky back (this last one until every flaky event is SUCCESS, or 90 s).
A redrive sweep runs every second, publishing straight to the consumer (as
Pub/Sub would push or hand it out). Scenarios:

* ``push``: ``gunicorn main:app`` (2 workers x 4 threads), ``--concurrency``
  client threads posting push bodies;
* ``push uvicorn async`` (``--down slow`` only, with slow calls and the bulkhead):
  ``main:asgi_app`` under gunicorn's uvicorn worker (2 workers) and the ``async def``
  handler: a push runs on a thread of the ASGI entry's pool
  (``EVENTBUS_ASYNC_CONCURRENCY``), its partner call awaited on the processor's loop, so a
  slow call holds none of gunicorn's 4 threads;
* ``worker``: the real ``PullWorker`` over the real ``Processor``, batches of
  ``--batch`` (half each partner) from an in-process source, handlers in 8
  threads;

each with the breaker (``EVENTBUS_BREAKER_FAILURES=5``, open 5 s, probe 5 s)
and without it (failures 10^9: today's behaviour, every dead call made). With
``--down slow`` "breaker" means slow calls counted (``EVENTBUS_BREAKER_SLOW_SECONDS``
0.4, share 0.5 of the latest 10, at least 5) and a bulkhead of 2 calls per process
(``EVENTBUS_PARTNER_CONCURRENCY``, a 50 ms wait); "today" is neither (issue 24's
breaker only, which a slow partner never opens).

Figures per scenario: the healthy partner's events/s while flaky is down
divided by the same with both up (target >= 0.9), the same for its p99
latency (push: per request; worker: per batch); calls made to the dead
partner while down (how many before the breaker opened, how many after: the
probes); the time from flaky's recovery to its last event stored SUCCESS; and
duplicate deliveries (2xx answers per ``Idempotency-Key`` beyond the first).

What it cannot show: Pub/Sub slowing a whole push subscription when its
success rate drops (nothing here is Pub/Sub; without the breaker the dead
partner's events answer 503 and are not redelivered, so "recovery" is n/a).
What it shows is the other half: a dead partner's calls holding the
service's threads (or a batch) while the healthy partner's events wait.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import requests  # noqa: E402

from bench.pull import Message, database_uri  # noqa: E402
from eventbus.partners import Partners as PartnerGroup  # noqa: E402
from eventbus.partners.store import store_beside  # noqa: E402
from eventbus.processor import Intake, Processor  # noqa: E402
from eventbus.settings import Settings  # noqa: E402
from eventbus.store.mongo import MongoEventStore  # noqa: E402
from eventbus.workers.pull import Inbox, PullWorker  # noqa: E402
from eventbus.workers.redrive import Redriver  # noqa: E402

HEALTHY, FLAKY = "healthy", "flaky"
TIMEOUT = 1.0
SLOW, SLOW_TIMEOUT, SLOW_SECONDS = 0.8, 2.0, 0.4
"""``--down slow``: the answer's time, the call's deadline, what counts as slow (8 s, 20 s and
4 s in the issue's terms, scaled down by 10)."""
NO_BREAKER = 10**9


def deadline_of(mode: str) -> float:
    """The partner call's total deadline in ``mode``: above a slow answer, for ``slow``."""
    return SLOW_TIMEOUT if mode == "slow" else TIMEOUT


@dataclass
class Knobs:
    """What one run does."""

    phase: float = 15.0
    down: str = "hang"
    concurrency: int = 8
    batch: int = 20
    open_seconds: float = 5.0


# -- the partners --------------------------------------------------------------------------

class Partners:
    """The two partners' HTTP server: who is down, and every call with its time and answer."""

    def __init__(self, down_mode: str) -> None:
        self.down: set[str] = set()
        self.mode = down_mode
        self.calls: list[tuple[float, str, str, int]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def template(self) -> str:
        """``BENCH_PARTNER_URL``."""
        return f"http://127.0.0.1:{self.server.server_port}/{{partnerId}}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        partners = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                started = time.monotonic()  # when the call was made, not answered
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                partner, status = self.path.strip("/"), 204
                if partner in partners.down and partners.mode == "slow":
                    time.sleep(SLOW)  # answers, slowly, under its deadline
                elif partner in partners.down:
                    status = 503
                    if partners.mode == "hang":
                        time.sleep(TIMEOUT * 1.5)
                with partners.lock:
                    partners.calls.append((started, partner,
                                           self.headers.get("Idempotency-Key", ""), status))
                with contextlib.suppress(OSError):  # the caller gave up (its deadline)
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        return Handler

    def duplicates(self) -> int:
        """2xx answers per key beyond the first."""
        counts = collections.Counter(key for _, _, key, status in self.calls if status < 300)
        return sum(n - 1 for n in counts.values() if n > 1)

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def event(partner: str, n: int, tag: str,
          event_type: str = "BENCH_PARTNER") -> tuple[bytes, dict[str, str]]:
    """One bench event for ``partner``: its body and attributes (``BENCH_PARTNER_ASYNC``: the
    same call from the ``async def`` handler)."""
    body = {"event_type": event_type, "event_version": "v1",
            "entity_metadata": {"partnerId": partner, "entity_id": f"e-{n}",
                                "entity_type": "Bench"}, "entity_data": {"n": n}}
    return json.dumps(body).encode(), {"idempotency_key": f"{tag}-{n}"}


# -- what a scenario records -------------------------------------------------------------------

@dataclass
class Timeline:
    """Phase boundaries (monotonic), answers, and the breaker as polled."""

    start: float = 0.0
    down_at: float = 0.0
    up_at: float = 0.0
    answers: list[tuple[float, float, str, bool]] = field(default_factory=list)
    """(started, latency, partner, processed)."""
    first_open: float | None = None
    half_opens: int = 0
    recovered: float | None = None

    def healthy(self, since: float, until: float) -> tuple[float, float]:
        """Healthy events/s and p99 latency (s) among answers started in [since, until)."""
        found = [lat for at, lat, partner, ok in self.answers
                 if partner == HEALTHY and ok and since <= at < until]
        if len(found) < 2:
            return 0.0, float("nan")
        return len(found) / (until - since), statistics.quantiles(found, n=100)[98]


@dataclass
class Figures:
    """One scenario's results."""

    name: str
    rate_ratio: float
    p99_ratio: float
    rate_both: float
    rate_down: float
    dead_calls: int
    to_open: int
    while_open: int
    half_opens: int
    recovery: float | None
    duplicates: int


def figures(name: str, line: Timeline, partners: Partners) -> Figures:
    """Reduce a timeline to the bench's figures."""
    rate_both, p99_both = line.healthy(line.start, line.down_at)
    rate_down, p99_down = line.healthy(line.down_at, line.up_at)
    # A slow partner answers 204: each of its calls while slow counts, not only failures.
    dead = [at for at, partner, _, status in partners.calls
            if partner == FLAKY and line.down_at <= at < line.up_at
            and (status >= 300 or partners.mode == "slow")]
    opened = line.first_open if line.first_open is not None else float("inf")
    to_open = sum(1 for at in dead if at < opened)
    recovery = None if line.recovered is None else line.recovered - line.up_at
    return Figures(name, rate_down / rate_both if rate_both else 0.0, p99_down / p99_both,
                   rate_both, rate_down, len(dead), to_open, len(dead) - to_open,
                   line.half_opens, recovery, partners.duplicates())


# -- the scenarios ----------------------------------------------------------------------------

def settings(uri: str, db: str, breaker: bool, mode: str = "hang") -> Settings:
    """The service's settings: the bench's breaker (or none), a quiet log; with ``mode``
    ``slow`` and the breaker, slow calls counted and a bulkhead of 2 per process."""
    slow = breaker and mode == "slow"
    limits = Settings(breaker_slow_seconds=SLOW_SECONDS, breaker_slow_share=0.5,
                      breaker_slow_min_calls=5, breaker_slow_window=10, partner_concurrency=2,
                      partner_concurrency_wait_seconds=0.05,
                      partner_concurrency_park_seconds=1.0) if slow else Settings()
    # A nacked event comes back after 10 s: Pub/Sub's redelivery, which nothing here does
    # (shorter, and a backlog of redriven messages not yet consumed is redriven again).
    return Settings(mongodb_uri=uri, mongodb_db=db, relay_inline=False, redrive_after_seconds=10,
                    breaker_failures=5 if breaker else NO_BREAKER, breaker_open_seconds=5,
                    breaker_probe_seconds=5, breaker_open_cap_seconds=20, log_level="ERROR",
                    breaker_slow_seconds=limits.breaker_slow_seconds,
                    breaker_slow_share=limits.breaker_slow_share,
                    breaker_slow_min_calls=limits.breaker_slow_min_calls,
                    breaker_slow_window=limits.breaker_slow_window,
                    partner_concurrency=limits.partner_concurrency,
                    partner_concurrency_wait_seconds=limits.partner_concurrency_wait_seconds,
                    partner_concurrency_park_seconds=limits.partner_concurrency_park_seconds)


def environment(config: Settings, partners: Partners) -> dict[str, str]:
    """The service's environment for ``config``."""
    return {"MONGODB_URI": config.mongodb_uri, "MONGODB_DB": config.mongodb_db,
            "EVENTBUS_HANDLER_MODULES": "bench.partner_handlers",
            "BENCH_PARTNER_URL": partners.template,
            "BENCH_PARTNER_TIMEOUT": str(deadline_of(partners.mode)),
            "EVENTBUS_RELAY_INLINE": "false", "LOG_LEVEL": "ERROR",
            "EVENTBUS_REDRIVE_AFTER_SECONDS": str(config.redrive_after_seconds),
            "EVENTBUS_BREAKER_FAILURES": str(config.breaker_failures),
            "EVENTBUS_BREAKER_OPEN_SECONDS": str(config.breaker_open_seconds),
            "EVENTBUS_BREAKER_PROBE_SECONDS": str(config.breaker_probe_seconds),
            "EVENTBUS_BREAKER_OPEN_CAP_SECONDS": str(config.breaker_open_cap_seconds),
            "EVENTBUS_BREAKER_SLOW_SECONDS": str(config.breaker_slow_seconds),
            "EVENTBUS_BREAKER_SLOW_SHARE": str(config.breaker_slow_share),
            "EVENTBUS_BREAKER_SLOW_MIN_CALLS": str(config.breaker_slow_min_calls),
            "EVENTBUS_BREAKER_SLOW_WINDOW": str(config.breaker_slow_window),
            "EVENTBUS_PARTNER_CONCURRENCY": str(config.partner_concurrency),
            "EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS":
                str(config.partner_concurrency_wait_seconds),
            "EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS":
                str(config.partner_concurrency_park_seconds)}


class Sweeper:
    """The redrive, once a second, publishing through ``send``; and the breaker, polled."""

    def __init__(self, store: MongoEventStore, config: Settings,
                 send: Callable[[bytes, dict[str, str]], Any], line: Timeline) -> None:
        from bench.partner_handlers import routes

        self.store, self.line, self.stop = store, line, threading.Event()
        publisher = _Publisher(send)
        self.redriver = Redriver(store, publisher, config, now=lambda: datetime.now(UTC),
                                 locate=Intake(store, routes).locate)
        self.threads = [threading.Thread(target=self._redrive, daemon=True),
                        threading.Thread(target=self._poll, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _redrive(self) -> None:
        while not self.stop.wait(1.0):
            with contextlib.suppress(Exception):
                self.redriver.sweep()

    def _poll(self) -> None:
        state = "closed"
        while not self.stop.wait(0.05):
            with contextlib.suppress(Exception):
                stored = store_beside(self.store, Settings()).breaker_get(FLAKY) or {}
                found = str(stored.get("state", "closed"))
                if found != "closed" and self.line.first_open is None:
                    self.line.first_open = time.monotonic()
                self.line.half_opens += found == "half_open" and state != "half_open"
                state = found

    def close(self) -> None:
        """Stop both loops."""
        self.stop.set()
        for thread in self.threads:
            thread.join(5)


@dataclass
class _Publisher:
    send: Callable[[bytes, dict[str, str]], Any]

    def publish_message(self, data: bytes, attributes: Any = None, *, ordering_key: Any = None,
                        timeout: Any = None, topic: Any = None) -> str:
        """Hand the message straight to the consumer."""
        self.send(data, dict(attributes or {}))
        return uuid.uuid4().hex


def phases(line: Timeline, knobs: Knobs, partners: Partners, store: MongoEventStore,
           breaker: bool) -> None:
    """Run the three phases while the load runs; wait for recovery (with the breaker)."""
    time.sleep(2.0)  # warm-up: connections, imports, the first batch
    line.start = time.monotonic()
    time.sleep(knobs.phase)
    line.down_at = time.monotonic()
    partners.down.add(FLAKY)
    time.sleep(knobs.phase)
    line.up_at = time.monotonic()
    up_ms = str(int(time.time() * 1000))  # events created before: the ones it missed
    partners.down.clear()
    deadline = time.monotonic() + (90 if breaker else 2)
    while breaker and time.monotonic() < deadline:
        left = store.collection.count_documents({"entity_metadata.partnerId": FLAKY,
                                                 "created": {"$lt": up_ms},
                                                 "event_status": {"$ne": "SUCCESS"}})
        if left == 0:
            line.recovered = time.monotonic()
            return
        time.sleep(0.2)


@contextlib.contextmanager
def fresh(uri: str, breaker: bool,
          mode: str = "hang") -> Iterator[tuple[Settings, MongoEventStore]]:
    """A throwaway database and a store on it."""
    config = settings(uri, f"bench_partners_{uuid.uuid4().hex[:8]}", breaker, mode)
    store = MongoEventStore.from_settings(config)
    store.ensure_indexes()
    try:
        yield config, store
    finally:
        store.close()
        _drop(uri, config.mongodb_db)


def _drop(uri: str, name: str) -> None:
    """Drop the bench's database; a slow server (DocumentDB under load) gets a minute."""
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(uri, socketTimeoutMS=60_000)
    try:
        client.drop_database(name)
    except Exception as exc:  # leave it to the operator, do not lose the figures
        print(f"bench: database {name} not dropped: {exc}", file=sys.stderr)
    finally:
        client.close()


def push_scenario(uri: str, knobs: Knobs, breaker: bool) -> Figures:
    """gunicorn main:app, ``knobs.concurrency`` clients posting push bodies."""
    return _push_through(uri, knobs, breaker, Entry("push", "main:app", (), "BENCH_PARTNER"))


def asgi_push_scenario(uri: str, knobs: Knobs, breaker: bool) -> Figures:
    """``main:asgi_app`` under gunicorn's uvicorn worker with the ``async def`` handler: each
    push on a thread of the ASGI entry's pool, the partner call awaited on the loop."""
    return _push_through(uri, knobs, breaker, Entry(
        "push uvicorn async", "main:asgi_app", ("-k", "uvicorn_worker.UvicornWorker"),
        "BENCH_PARTNER_ASYNC"))


@dataclass(frozen=True)
class Entry:
    """How the service is run: the row's name, the app, gunicorn's extra arguments, the
    event type (its handler sync or async)."""

    name: str
    app: str
    args: tuple[str, ...]
    event_type: str


def _push_through(uri: str, knobs: Knobs, breaker: bool, entry: Entry) -> Figures:
    from tests.e2e.harness import ServiceProcess

    partners, line, stop = Partners(knobs.down), Timeline(), threading.Event()
    with fresh(uri, breaker, knobs.down) as (config, store):
        service = ServiceProcess(Path(tempfile.gettempdir()) / "bench-partners.log",
                                 app=entry.app, env=environment(config, partners),
                                 extra_args=entry.args)
        url = service.start()
        # Pub/Sub pushes redriven messages with its own concurrency: a pool of 8 here.
        pushers = concurrent.futures.ThreadPoolExecutor(8)
        sweeper = Sweeper(store, config, lambda data, attrs: pushers.submit(
            _push, requests, url, data, attrs), line)
        tag, counter = uuid.uuid4().hex[:6], iter(range(10**9))
        # With a slow partner each client keeps to one partner: Pub/Sub pushes concurrently,
        # so a slow answer must not hold back the next healthy push (closed-loop clients
        # taking turns would measure the load generator, not the service).
        own = knobs.down == "slow"
        clients = [threading.Thread(target=_client, args=(
            url, tag, counter, line, stop, (HEALTHY, FLAKY)[i % 2] if own else "",
            entry.event_type), daemon=True) for i in range(knobs.concurrency)]
        try:
            for client in clients:
                client.start()
            phases(line, knobs, partners, store, breaker)
        finally:
            stop.set()
            for client in clients:
                client.join(10)
            sweeper.close()
            pushers.shutdown(wait=True, cancel_futures=True)
            service.stop()
            partners.close()
    return figures(f"{entry.name}, {label(breaker, knobs.down)}", line, partners)


def _push(http: Any, url: str, data: bytes, attributes: dict[str, str]) -> dict[str, Any]:
    import base64

    body = {"message": {"data": base64.b64encode(data).decode(), "attributes": attributes,
                        "messageId": uuid.uuid4().hex},
            "subscription": "projects/local-project/subscriptions/bench"}
    answer = http.post(url, json=body, timeout=30)
    return dict(answer.json()) if answer.content else {}


def _client(url: str, tag: str, counter: Iterator[int], line: Timeline,
            stop: threading.Event, only: str = "", event_type: str = "BENCH_PARTNER") -> None:
    http = requests.Session()
    while not stop.is_set():
        n = next(counter)
        partner = only or (HEALTHY if n % 2 == 0 else FLAKY)
        started = time.monotonic()
        try:
            answer = _push(http, url, *event(partner, n, tag, event_type))
        except (requests.RequestException, ValueError):
            answer = {}
        line.answers.append((started, time.monotonic() - started, partner,
                             answer.get("outcome") == "processed"))


def worker_scenario(uri: str, knobs: Knobs, breaker: bool) -> Figures:
    """The real PullWorker over the real Processor, batches from an in-process source."""
    partners, line = Partners(knobs.down), Timeline()
    os.environ.update(BENCH_PARTNER_URL=partners.template,
                      BENCH_PARTNER_TIMEOUT=str(deadline_of(knobs.down)))
    from bench.partner_handlers import routes

    with fresh(uri, breaker, knobs.down) as (config, store):
        processor = Processor(store, routes, config, lambda: datetime.now(UTC), concurrency=8,
                              partners=PartnerGroup.beside(store, config))
        worker = PullWorker(processor, Inbox(), subscription="bench", batch_size=knobs.batch)
        redriven: collections.deque[Message] = collections.deque()
        sweeper = Sweeper(store, config, lambda data, attrs: redriven.append(
            _message(data, attrs)), line)
        stop = threading.Event()
        driver = threading.Thread(target=_drive, args=(worker, knobs, redriven, line, stop),
                                  daemon=True)
        try:
            driver.start()
            phases(line, knobs, partners, store, breaker)
        finally:
            stop.set()
            driver.join(30)
            sweeper.close()
            processor.close()
            partners.close()
    return figures(f"worker, {label(breaker, knobs.down)}", line, partners)


def label(breaker: bool, mode: str) -> str:
    """A scenario's name: what protects the healthy partner."""
    if mode == "slow":
        return "slow calls + bulkhead" if breaker else "today (a slow partner opens nothing)"
    return "breaker" if breaker else "no breaker (today)"


def _message(data: bytes, attributes: dict[str, str]) -> Message:
    message = Message(0, "redrive")
    message.data, message.attributes = data, attributes
    return message


def _drive(worker: PullWorker, knobs: Knobs, redriven: collections.deque[Message],
           line: Timeline, stop: threading.Event) -> None:
    tag, n = uuid.uuid4().hex[:6], 0
    while not stop.is_set():
        # Redriven messages first, as a subscription's backlog would come, with new ones beside.
        batch = [redriven.popleft() for _ in range(min(len(redriven), knobs.batch * 3 // 4))]
        for _ in range(knobs.batch - len(batch)):
            message = _message(*event(HEALTHY if n % 2 == 0 else FLAKY, n, tag))
            batch.append(message)
            n += 1
        started = time.monotonic()
        results = worker.run_batch(batch)
        took = time.monotonic() - started
        for message, result in zip(batch, results, strict=True):
            partner = json.loads(message.data)["entity_metadata"]["partnerId"]
            line.answers.append((started, took, partner, result.outcome.value == "processed"))


# -- the report ----------------------------------------------------------------------------------

def table(rows: list[Figures]) -> str:
    """The Markdown table of ``rows``."""
    lines = ["| scenario | healthy events/s, both up | while flaky down | ratio | p99 ratio "
             "| calls to flaky while down (to open + after) | half-open windows "
             "| recovery s | duplicates |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        recovery = "n/a" if row.recovery is None else f"{row.recovery:.1f}"
        lines.append(f"| {row.name} | {row.rate_both:.0f} | {row.rate_down:.0f} | "
                     f"{row.rate_ratio:.2f} | {row.p99_ratio:.2f} | {row.dead_calls} "
                     f"({row.to_open} + {row.while_open}) | {row.half_opens} | {recovery} | "
                     f"{row.duplicates} |")
    return "\n".join(lines)


def median(runs: list[list[Figures]]) -> list[Figures]:
    """Each figure's median over the runs, row by row."""
    rows = []
    for same in zip(*runs, strict=True):
        def med(name: str, same: tuple[Figures, ...] = same) -> Any:
            values = [getattr(row, name) for row in same if getattr(row, name) is not None]
            return statistics.median(values) if values else None
        rows.append(Figures(same[0].name, *(med(name) for name in (
            "rate_ratio", "p99_ratio", "rate_both", "rate_down", "dead_calls", "to_open",
            "while_open", "half_opens", "recovery", "duplicates"))))
    return rows


def main() -> None:
    """Run the scenarios ``--runs`` times; print each run's table and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--phase", type=float, default=15.0)
    parser.add_argument("--down", choices=("hang", "503", "slow"), default="hang")
    parser.add_argument("--quick", action="store_true", help="phases of 6 s")
    args = parser.parse_args()
    logging.getLogger("eventbus").setLevel(logging.ERROR)  # the worker's per-event lines
    knobs = Knobs(phase=6.0 if args.quick else args.phase, down=args.down)
    uri, runs = database_uri(), []
    for run in range(args.runs):
        rows = [push_scenario(uri, knobs, breaker) for breaker in (True, False)]
        if args.down == "slow":  # where waiting on a partner holds no gunicorn thread
            rows.append(asgi_push_scenario(uri, knobs, True))
        rows += [worker_scenario(uri, knobs, breaker) for breaker in (True, False)]
        print(f"run {run + 1}:\n{table(rows)}\n", flush=True)
        runs.append(rows)
    if args.runs > 1:
        print(f"median of {args.runs} runs:\n{table(median(runs))}")


if __name__ == "__main__":
    main()
