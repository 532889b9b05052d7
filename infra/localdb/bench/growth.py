"""Does a claim cost the same at 50,000 records as at 1,000? The store's cost as a collection grows.

usage: python infra/localdb/bench/growth.py [--events 50000] [--chunk 1000] [--runs 1] [--uri URI]

On a fresh collection with the service's indexes (``MongoEventStore.ensure_indexes``),
one client thread runs the service's own claim and owner-checked finish
(``MongoEventStore.claim`` then ``succeed``) for ``--events`` new events, in
chunks of ``--chunk``. Per chunk it reports events/s and the machine's CPU per
event (all processes, from ``/proc/stat``: the engine's work is where the cost
grows, not the client's), then the late chunks (the last fifth) against the
early ones (the second to fifth chunks: the first holds warm-up) as one ratio.
Target: at least 0.9, i.e. the cost of an event does not grow with the data.

With ``--runs N`` the whole run repeats on a new collection and the table shows
each chunk's median over the runs.

The database is ``MONGODB_URI`` (or ``--uri``) when set; otherwise the local
server of the ``localdb`` tool, started if needed and left running like any
``localdb start``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from eventbus.store.mongo import MongoEventStore
from pymongo import MongoClient

DB = "bench_growth"
LEASE = timedelta(minutes=5)


@dataclass(frozen=True)
class Chunk:
    """One chunk's figures: events per second and machine CPU milliseconds per event."""

    records: int
    rate: float
    cpu_ms: float


def machine_cpu_seconds() -> float:
    """CPU seconds spent by every process on the machine (busy time from /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def fields(i: int) -> dict[str, object]:
    """An event's stored fields, shaped like the service's (``documents.event_fields``)."""
    return {
        "event_version": "v1", "event_type": "OR_MGMT", "event_direction": "IN",
        "entity_metadata": {"partnerId": f"p{i % 7}", "partnerName": "Acme",
                            "entity_id": f"e{i}", "entity_type": "order"},
        "entity_data": {"orderId": i, "lines": [{"sku": "A1", "qty": 2}], "note": "x" * 120},
        "pubsub": {"message_id": str(i), "subscription": "bench"},
        "payload_fingerprint": uuid.uuid4().hex,
    }


def one_event(store: MongoEventStore, i: int) -> None:
    """The service's two round trips for a new event: claim, then the owner-checked finish."""
    key = f"growth-{i}-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    claim = store.claim(key, fields(i), now)
    if not store.succeed(key, claim.owner, now):
        raise SystemExit(f"finish of {key} lost its lease: the bench is not alone on {DB}")


def run(client: MongoClient, events: int, chunk: int) -> list[Chunk]:
    """One run on a new collection: a Chunk per ``chunk`` events."""
    collection = client[DB][f"events_{uuid.uuid4().hex[:8]}"]
    store = MongoEventStore(collection, created_by="bench", retention=timedelta(days=30),
                            lease=LEASE)
    store.ensure_indexes()
    chunks = []
    try:
        for start in range(0, events, chunk):
            cpu, wall = machine_cpu_seconds(), time.perf_counter()
            for i in range(start, start + chunk):
                one_event(store, i)
            wall, cpu = time.perf_counter() - wall, machine_cpu_seconds() - cpu
            chunks.append(Chunk(start + chunk, chunk / wall, cpu * 1000 / chunk))
            print(f"  {start + chunk:>7} records: {chunk / wall:7.0f} events/s", flush=True)
    finally:
        collection.drop()
    return chunks


def median_chunks(runs: list[list[Chunk]]) -> list[Chunk]:
    """Each chunk's median over the runs."""
    return [Chunk(group[0].records, statistics.median(c.rate for c in group),
                  statistics.median(c.cpu_ms for c in group))
            for group in zip(*runs, strict=True)]


def late_over_early(chunks: list[Chunk]) -> tuple[float, float]:
    """(rate ratio, CPU ratio) of the last fifth of chunks over chunks 2-5 (the first warms up)."""
    early = chunks[1:5] if len(chunks) >= 6 else chunks[:1]
    late = chunks[-max(1, len(chunks) // 5):]
    rate = statistics.median(c.rate for c in late) / statistics.median(c.rate for c in early)
    cpu = statistics.median(c.cpu_ms for c in late) / statistics.median(c.cpu_ms for c in early)
    return rate, cpu


def table(chunks: list[Chunk], every: int) -> str:
    """The chunks as a markdown table (every ``every``-th row, plus the last)."""
    rows = ["| records | events/s | machine CPU ms/event |", "|---:|---:|---:|"]
    for n, c in enumerate(chunks):
        if n % every == 0 or n == len(chunks) - 1:
            rows.append(f"| {c.records:,} | {c.rate:.0f} | {c.cpu_ms:.2f} |")
    return "\n".join(rows)


def database_uri(given: str | None) -> str:
    """--uri, else MONGODB_URI, else the localdb tool's server (started if needed)."""
    if given or os.environ.get("MONGODB_URI"):
        return given or os.environ["MONGODB_URI"]
    from localdb import ensure_started  # the bench may run against any MongoDB without it
    return ensure_started()


def main() -> None:
    """Parse the options, run, print the table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--uri")
    args = parser.parse_args()
    client: MongoClient = MongoClient(database_uri(args.uri), tz_aware=True)
    runs = []
    for n in range(args.runs):
        print(f"run {n + 1}/{args.runs}: {args.events} events in chunks of {args.chunk}")
        runs.append(run(client, args.events, args.chunk))
    chunks = median_chunks(runs)
    print(table(chunks, max(1, len(chunks) // 10)))
    rate, cpu = late_over_early(chunks)
    print(f"\nlate / early: events/s {rate:.2f} (target >= 0.90), machine CPU per event {cpu:.2f}")


if __name__ == "__main__":
    main()
