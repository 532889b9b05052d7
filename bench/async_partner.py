"""A partner answering in 200 ms: sync handlers on threads against ``async def`` handlers.

    .venv/bin/python bench/async_partner.py [--runs 3] [--quick]

The partner is a uvicorn process (this module's ``partner_app``) that answers
every POST with 204 after ``--delay`` seconds (200 ms). The handlers are
``bench/partner_handlers.py``'s: ``BENCH_PARTNER`` (the partner app's sync call:
guard, breaker, deadline client on requests) and ``BENCH_PARTNER_ASYNC`` (the
same through ``context.guard.run_async``, ``context.partner(id).call_async`` and
httpx). The store is ``MONGODB_URI`` (else the localdb tool's), a throwaway
database per scenario.

Rows:

* ``worker sync, --concurrency C``: the real ``PullWorker`` over the real
  ``Processor`` and ``MongoEventStore``, batches of 100 from an in-process
  source (as ``bench/pull.py``), sync handlers on C threads (1 is the
  worker's default; 8, 32 and 64 look for its best);
* ``worker async``: the same with the async handler (batches of 100 awaiting on
  the processor's loop, ``EVENTBUS_ASYNC_CONCURRENCY`` 100);
* ``push gunicorn sync`` / ``push gunicorn async``: ``gunicorn main:app`` (2
  workers x 4 threads, the default) with the sync or the async handler;
  ``push uvicorn async``: ``main:asgi_app`` under gunicorn's uvicorn worker
  (2 workers); 64 client threads post push bodies for ``--seconds``.

Figures: events/s (events stored SUCCESS over the wall time), CPU ms per event
(the worker rows: this process's CPU, which is the worker; the push rows: the
service's process group, from ``/proc``), and the ratios asked for: async
worker over sync at the default and at its best concurrency (target >= 10x the
default, at no more CPU per event), uvicorn over gunicorn. The partner's CPU
(its own process) and the database's are in no row. The machine has 2 cores
shared with other jobs: figures move between runs, hence medians.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import requests  # noqa: E402

from bench.pull import database_uri  # noqa: E402
from eventbus.processor import Processor  # noqa: E402
from eventbus.settings import Settings  # noqa: E402
from eventbus.store.mongo import MongoEventStore  # noqa: E402
from eventbus.workers.pull import Inbox, PullWorker  # noqa: E402

DELAY = 0.2


async def partner_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The partner: reads the request, waits ``BENCH_DELAY`` seconds, answers 204."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(float(os.environ.get("BENCH_DELAY", DELAY)))
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@contextmanager
def partner(delay: float) -> Iterator[str]:
    """The partner's uvicorn process; yields ``BENCH_PARTNER_URL``."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.async_partner:partner_app", "--port", str(port),
         "--log-level", "warning", "--backlog", "4096", "--limit-concurrency", "10000"],
        cwd=ROOT, env={**os.environ, "BENCH_DELAY": str(delay)})
    try:
        _wait(f"http://127.0.0.1:{port}/")
        yield f"http://127.0.0.1:{port}/{{partnerId}}"
    finally:
        process.terminate()
        process.wait(10)


@dataclass
class Row:
    """One scenario's figures."""

    name: str
    events_s: float
    cpu_ms: float


class Message:
    """An in-process pulled message (acks and nacks cost nothing)."""

    def __init__(self, event_type: str, n: int, tag: str) -> None:
        self.data, self.attributes = event(event_type, n, tag)
        self.message_id, self.ordering_key, self.delivery_attempt = f"m-{n}", "", 1

    def ack(self) -> None:
        """Nothing to tell anyone."""

    def nack(self) -> None:
        """Nothing to tell anyone."""

    def ack_with_response(self) -> Any:
        """Never used: not an exactly-once subscription."""
        raise NotImplementedError


def event(event_type: str, n: int, tag: str) -> tuple[bytes, dict[str, str]]:
    """A bench event of ``event_type``, its own partner and entity (no shared rate)."""
    body = {"event_type": event_type, "event_version": "v1",
            "entity_metadata": {"partnerId": "acme", "entity_id": f"e-{n}",
                                "entity_type": "Bench"}, "entity_data": {"n": n}}
    return json.dumps(body).encode(), {"idempotency_key": f"{tag}-{n}"}


@contextmanager
def fresh(uri: str) -> Iterator[Settings]:
    """Settings on a throwaway database (dropped after)."""
    from pymongo import MongoClient

    config = Settings(mongodb_uri=uri, mongodb_db=f"bench_async_{uuid.uuid4().hex[:8]}",
                      relay_inline=False, log_level="ERROR")
    try:
        yield config
    finally:
        client: MongoClient[dict[str, Any]] = MongoClient(uri, socketTimeoutMS=60_000)
        client.drop_database(config.mongodb_db)
        client.close()


def worker_row(uri: str, url: str, event_type: str, concurrency: int, events: int) -> Row:
    """The real worker over the real store, batches of 100 (fewer when there are fewer)."""
    from bench.partner_handlers import routes

    os.environ["BENCH_PARTNER_URL"], os.environ["BENCH_PARTNER_TIMEOUT"] = url, "5"
    with fresh(uri) as config:
        store = MongoEventStore.from_settings(config)
        store.ensure_indexes()
        processor = Processor(store, routes, config, lambda: datetime.now(UTC),
                              concurrency=concurrency)
        worker = PullWorker(processor, Inbox(), subscription="bench", batch_size=100)
        tag = uuid.uuid4().hex[:6]
        messages = [Message(event_type, n, tag) for n in range(events)]
        worker.run_batch([Message(event_type, -1, tag)])  # warm: clients, pools, the loop
        cpu, started = time.process_time(), time.perf_counter()
        done = 0
        for at in range(0, events, 100):
            results = worker.run_batch(messages[at:at + 100])
            done += sum(result.outcome.value == "processed" for result in results)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        processor.close()
        store.close()
    label = "async" if event_type.endswith("ASYNC") else f"sync, --concurrency {concurrency}"
    return Row(f"worker {label}", done / wall, cpu * 1000 / max(done, 1))


def push_row(uri: str, url: str, name: str, app: str, event_type: str, seconds: float,
             extra: tuple[str, ...] = ()) -> Row:
    """``app`` under gunicorn (``extra``: its worker class), 64 client threads posting."""
    from tests.e2e.harness import ServiceProcess

    with fresh(uri) as config:
        env = {"MONGODB_URI": uri, "MONGODB_DB": config.mongodb_db, "LOG_LEVEL": "ERROR",
               "EVENTBUS_HANDLER_MODULES": "bench.partner_handlers", "BENCH_PARTNER_URL": url,
               "BENCH_PARTNER_TIMEOUT": "5", "EVENTBUS_RELAY_INLINE": "false"}
        service = ServiceProcess(Path(tempfile.gettempdir()) / "bench-async-partner.log",
                                 app=app, env=env, extra_args=extra)
        base = service.start()
        assert service.process is not None
        group = service.process.pid
        tag, stop, counts = uuid.uuid4().hex[:6], threading.Event(), [0] * 64
        numbers = iter(range(10**9))
        lock = threading.Lock()

        def post(slot: int) -> None:
            http = requests.Session()
            while not stop.is_set():
                with lock:
                    n = next(numbers)
                data, attributes = event(event_type, n, tag)
                body = {"message": {"data": base64.b64encode(data).decode(),
                                    "attributes": attributes, "messageId": f"m-{n}"},
                        "subscription": "projects/local-project/subscriptions/bench"}
                answer = http.post(base + "/", json=body, timeout=60)
                if not stop.is_set() and answer.status_code == 200:
                    counts[slot] += 1

        clients = [threading.Thread(target=post, args=(slot,), daemon=True) for slot in range(64)]
        for client in clients:
            client.start()
        time.sleep(2)  # warm
        counts[:] = [0] * 64
        cpu, started = group_cpu(group), time.perf_counter()
        time.sleep(seconds)
        stop.set()
        wall, cpu = time.perf_counter() - started, group_cpu(group) - cpu
        done = sum(counts)
        for client in clients:
            client.join(30)
        service.stop()
    return Row(name, done / wall, cpu * 1000 / max(done, 1))


def group_cpu(group: int) -> float:
    """CPU seconds (user + sys) of a process group, reaped children included."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def run(uri: str, url: str, knobs: argparse.Namespace) -> list[Row]:
    """One run of every row."""
    n = knobs.events
    rows = [worker_row(uri, url, "BENCH_PARTNER", 1, knobs.events_default)]
    rows += [worker_row(uri, url, "BENCH_PARTNER", c, n) for c in knobs.concurrency]
    rows.append(worker_row(uri, url, "BENCH_PARTNER_ASYNC", 1, n))
    rows.append(push_row(uri, url, "push gunicorn sync", "main:app", "BENCH_PARTNER",
                         knobs.seconds))
    rows.append(push_row(uri, url, "push gunicorn async", "main:app", "BENCH_PARTNER_ASYNC",
                         knobs.seconds))
    rows.append(push_row(uri, url, "push uvicorn async", "main:asgi_app",
                         "BENCH_PARTNER_ASYNC", knobs.seconds,
                         ("-k", "uvicorn_worker.UvicornWorker")))
    return rows


def table(rows: list[Row]) -> str:
    """The rows and the ratios, as Markdown."""
    lines = ["| row | events/s | CPU ms/event |", "| --- | ---: | ---: |"]
    lines += [f"| {row.name} | {row.events_s:.1f} | {row.cpu_ms:.2f} |" for row in rows]
    by = {row.name: row for row in rows}
    sync = [row for row in rows if row.name.startswith("worker sync")]
    default, best = sync[0], max(sync, key=lambda row: row.events_s)
    fast = by["worker async"]
    lines.append("")
    lines.append(f"worker async / sync default: {fast.events_s / default.events_s:.1f}x events/s, "
                 f"{fast.cpu_ms / default.cpu_ms:.2f}x CPU/event; / sync best ({best.name}): "
                 f"{fast.events_s / best.events_s:.1f}x events/s, "
                 f"{fast.cpu_ms / best.cpu_ms:.2f}x CPU/event")
    uvicorn, gunicorn = by["push uvicorn async"], by["push gunicorn async"]
    ratio = uvicorn.events_s / gunicorn.events_s
    lines.append(f"push uvicorn async / gunicorn async: {ratio:.2f}x events/s, "
                 f"{uvicorn.cpu_ms / gunicorn.cpu_ms:.2f}x CPU/event; gunicorn async / "
                 f"sync: {gunicorn.events_s / by['push gunicorn sync'].events_s:.2f}x events/s")
    return "\n".join(lines)


def main() -> None:
    """Run the rows ``--runs`` times; print each run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--events-default", type=int, default=30,
                        help="events for the sync worker at --concurrency 1 (5/s)")
    parser.add_argument("--concurrency", default="8,32,64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delay", type=float, default=DELAY)
    parser.add_argument("--quick", action="store_true", help="one short run")
    knobs = parser.parse_args()
    knobs.concurrency = [int(c) for c in knobs.concurrency.split(",")]
    if knobs.quick:
        knobs.events, knobs.events_default, knobs.seconds = 200, 10, 4.0
    uri = database_uri()
    runs: list[list[Row]] = []
    with partner(knobs.delay) as url:
        for number in range(knobs.runs):
            runs.append(run(uri, url, knobs))
            print(f"run {number + 1}\n{table(runs[-1])}\n", flush=True)
    medians = [Row(rows[0].name, statistics.median(r.events_s for r in rows),
                   statistics.median(r.cpu_ms for r in rows)) for rows in zip(*runs, strict=True)]
    print(f"median of {len(runs)}\n{table(medians)}")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str) -> None:
    for _ in range(100):
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.1)
    raise RuntimeError(f"the partner did not start at {url}")


if __name__ == "__main__":
    main()
