"""A rebuild of stored SUCCESS events against the pull worker, on the same store in one run.

    .venv/bin/python bench/rebuild.py [--events 10000] [--runs 3] [--batch 100]

Each run, on a fresh collection of one store (``MONGODB_URI``, else the local
server of the ``localdb`` tool):

- ``pull worker, batch B``: the real ``PullWorker`` and ``Processor`` with the
  no-op handler (``bench/noop_handlers.py``) over ``--events`` in-process
  messages, as ``bench/pull.py``'s ``worker, in-process`` row: this stores the
  events SUCCESS;
- ``rebuild, batch B``: ``eventbus rebuild``'s own objects (``Rebuild`` over a
  ``StoredSource`` selecting those events by type, a ``ReplayProcessor`` in
  replay mode, the store's clock as the command uses it) re-running the same
  no-op handler over every one of them through the batch path: the plan
  (``find_events``), a page read, the rebuild's lease, the finish with its
  audit entry, the checkpoints.

Round trips are every command this process sends (``bench/pull.py``'s
listener), divided by the events. Targets: rebuild events/s over the pull
worker's at least 0.8; rebuild round trips per event below 0.05. Medians
over ``--runs``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from pymongo import MongoClient  # noqa: E402

from bench.pull import (  # noqa: E402
    COMMANDS,
    Row,
    database_uri,
    fresh_store,
    noop_router,
    run_worker,
)
from eventbus.model.rebuild_policy import Replay  # noqa: E402
from eventbus.rebuild.mode import ReplayProcessor  # noqa: E402
from eventbus.rebuild.runner import Rebuild, Selection, StoredSource, new_run  # noqa: E402
from eventbus.settings import Settings  # noqa: E402
from eventbus.store.mongo import MongoEventStore  # noqa: E402
from eventbus.store.operator_queries import EventQuery  # noqa: E402


def pull_row(store: MongoEventStore, events: int, size: int) -> Row:
    """``events`` messages through the pull worker (stored SUCCESS); its first batch warms up."""
    return run_worker(store, size, events, "BENCH_NOOP", f"pull worker, batch {size}")


def rebuild_row(store: MongoEventStore, events: int, size: int) -> Row:
    """Every stored event rebuilt with the no-op handler, as ``eventbus rebuild --type`` runs."""
    selection = Selection(EventQuery(event_type="BENCH_NOOP", until=store.now()))
    run = new_run(by="bench", why="bench", started=store.now(), selection=selection, flags={})
    replay = Replay(str(run["rebuild_id"]), "bench", "bench", run["started"])
    processor = ReplayProcessor(store, noop_router(), Settings(relay_inline=False), store.now,
                                replay)
    job = Rebuild(store, processor, StoredSource(store, selection), run, batch=size)
    before, cpu, wall = COMMANDS.count, time.process_time(), time.perf_counter()
    try:
        report = job.run()
    finally:
        processor.close()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert report.counts["rebuilt"] == events and not report.failures, report.counts
    return Row(f"rebuild, batch {size}", events / wall, cpu / events * 1e6,
               (COMMANDS.count - before) / events)


def measure(uri: str, db: str, events: int, size: int) -> list[Row]:
    """One run: the pull worker stores the events, then the rebuild runs them again."""
    with fresh_store(uri, db) as store:
        pull = pull_row(store, events, size)
        return [pull, rebuild_row(store, events, size)]


def table(rows: list[Row]) -> str:
    """The rows as a markdown table, with the rebuild's ratio to the pull worker."""
    pull = rows[0]
    out = ["| row | events/s | CPU µs/event | round trips/event | vs pull events/s |",
           "|---|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r.rate / pull.rate:.2f}" if r is not pull else "-"
        out.append(f"| {r.name} | {r.rate:.0f} | {r.cpu_us or 0:.0f} | {r.trips or 0:.3f} "
                   f"| {ratio} |")
    return "\n".join(out)


def main() -> None:
    """Parse, measure ``--runs`` times, print the median table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    uri, db = database_uri(), f"bench_rebuild_{uuid.uuid4().hex[:6]}"
    runs = []
    try:
        for n in range(args.runs):
            print(f"run {n + 1}/{args.runs}", file=sys.stderr, flush=True)
            runs.append(measure(uri, db, args.events, args.batch))
            print(table(runs[-1]), file=sys.stderr, flush=True)
    finally:
        MongoClient(uri).drop_database(db)
    medians = [Row(group[0].name, statistics.median(r.rate for r in group),
                   statistics.median(r.cpu_us or 0 for r in group),
                   statistics.median(r.trips or 0 for r in group))
               for group in zip(*runs, strict=True)]
    ratios = sorted(rebuilt.rate / pull.rate for pull, rebuilt in runs)
    print(f"\nmedian of {args.runs} runs, {args.events} events per row")
    print(table(medians))
    print(f"\nrebuild / pull events/s per run: {', '.join(f'{r:.2f}' for r in ratios)} "
          "(target >= 0.8); rebuild round trips per event target < 0.05")


if __name__ == "__main__":
    main()
