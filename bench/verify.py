"""``eventbus verify`` over 10,000 stored events: events per second, median of 3 runs.

    .venv/bin/python bench/verify.py [--events 10000] [--runs 3]

The partner app (``handlers.create_router``) first runs orders on LocalBus
(in-memory store, mongomock for its projections, a local partner stub that
answers 200) until the store holds ``--events`` SUCCESS records: orders,
their ``PARTNER_NOTIFY`` steps (a guarded partner call) and their
``PARTNER_NOTIFY_SENT`` steps, plus public-topic forwards on the orders.
Then two rows, each timed ``--runs`` times (median reported):

- ``store records``: ``Verifier(router, StoreLookups(store)).run(records)``:
  the sandbox, the comparison, and the lookups of parents and stored guard
  results (on the memory store, so no network in the number);
- ``sample file``: the same records written as a sample (``sample_lines``),
  then read back (``parse_sample``) and verified: what the partner app's CI does.

Every run must find every event ``same``; the bench fails otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src"),
                str(Path(__file__).resolve().parents[1])]

import mongomock  # noqa: E402

from eventbus.rebuild.verify import (  # noqa: E402
    Report,
    StoreLookups,
    Verifier,
    parse_sample,
    sample_lines,
)
from eventbus.store.operator_queries import EventQuery  # noqa: E402
from eventbus.testing import LocalBus  # noqa: E402
from handlers import create_router  # noqa: E402
from handlers.settings import AppSettings, PartnerSettings  # noqa: E402

STATUSES = ("OR_PLC", "OR_CNF", "OR_SHP", "OR_DLV")


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def recorded(events: int) -> tuple[LocalBus, list[Mapping[str, Any]]]:
    """Run orders through the partner app until ``events`` SUCCESS records are stored."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/partners/{{partnerId}}/events"
    bus = LocalBus(create_router(AppSettings(partners=PartnerSettings(url=url))),
                   database=mongomock.MongoClient(tz_aware=True)["bench"])
    made, n = 0, 0
    while made < events:
        n += 1
        status = STATUSES[n % len(STATUSES)]
        bus.publish("OR_MGMT", {"orderId": n, "orderStatusLatest": status,
                                "orderStatusLatestTimestamp": 1763800000 + n,
                                "orderLineItems": [{"sku": "S", "quantity": 1}],
                                "orderSummary": {"total": n}},
                    entity={"partnerId": f"p{n % 7}", "entity_id": f"order-{n}",
                            "entity_type": "Order"}, version="v2")
        made += 3 if status in ("OR_CNF", "OR_SHP") else 1
        bus.clock.advance(0.01)
    server.shutdown()
    records = bus.store.find_events(EventQuery(statuses=("SUCCESS",)), limit=events)
    return bus, sorted(records, key=lambda r: r["created"])


def timed(run: Callable[[], Report], count: int) -> float:
    """Events per second of one run; every event must verify ``same``."""
    start = time.perf_counter()
    report = run()
    elapsed = time.perf_counter() - start
    if report.counts()["same"] != count:
        raise SystemExit(f"bench: not every event verified same: {report.counts()}")
    return count / elapsed


def main() -> None:
    """Run the bench and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    bus, records = recorded(args.events)
    print(f"recorded {len(records)} SUCCESS events in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    router = create_router(AppSettings())
    lookups = StoreLookups(bus.store)
    for record in records:  # what the sample carries: the side effects the run reads
        lookups.side_effect(str(record["idempotency_key"]))
    text = "\n".join(sample_lines(records, {}, lookups.side_effects)).encode()

    def from_store() -> Report:
        return Verifier(router, StoreLookups(bus.store)).run(records)

    def from_sample() -> Report:
        sample = parse_sample(text, "bench")
        return Verifier(router, sample.lookups).run(sample.items)

    rows = {"store records": from_store, "sample file": from_sample}
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.runs):  # round-robin: background load weighs on both rows alike
        for name, run in rows.items():
            rates[name].append(timed(run, len(records)))
    print("| row | events | runs | events/s (median) | min | max |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, found in rates.items():
        print(f"| {name} | {len(records)} | {args.runs} | {statistics.median(found):,.0f} | "
              f"{min(found):,.0f} | {max(found):,.0f} |")


if __name__ == "__main__":
    main()
