"""Watching events being processed: the status table and the cascades' progress.

* ``status_table``: one row per event type, one column per status (what
  ``eventbus status`` prints), with each FAILED event's error below;
* ``cascade_statuses``: the status of every event of the cascades started by
  some keys, children included as soon as a parent's outbox names them;
* ``watch``: a progress bar over those statuses until all are finished (the
  local demo, ``handlers/demo.py``).

Every stored value printed is escaped (``eventbus.ops.render.safe``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from eventbus.model.status import Status
from eventbus.ops.render import WIDTH, clip, safe, table
from eventbus.store.base import EventStore
from eventbus.store.documents import replays as rebuilds

STALE = "SUCCESS(stale)"
"""An ordered handler's event older than its entity's applied position: stored, never run."""
TERMINAL = (Status.SUCCESS, Status.FAILED, STALE)
NOT_YET_STORED = "NOT YET STORED"


def watch(store: EventStore, keys: Iterable[str], timeout: float, out: TextIO) -> bool:
    """Show progress until every event of the cascades from ``keys`` is finished.

    Children count as soon as a parent's outbox names them, so the total
    grows while the cascades unfold. Returns True if all finished in time.
    """
    roots, started = set(keys), time.monotonic()
    while True:
        statuses = cascade_statuses(store, roots)
        done = sum(1 for status in statuses.values() if status in TERMINAL)
        counts = Counter(statuses.values())
        bar = "#" * (30 * done // max(len(statuses), 1))
        print(f"\r  [{bar:<30}] {done}/{len(statuses)} finished  {dict(sorted(counts.items()))}"
              f"  {time.monotonic() - started:5.1f}s", end="", file=out, flush=True)
        if done == len(statuses) or time.monotonic() - started > timeout:
            print(file=out)
            return done == len(statuses)
        time.sleep(0.5)


def cascade_statuses(store: EventStore, roots: set[str]) -> dict[str, str]:
    """Return the status of every event from ``roots`` and their descendants."""
    statuses = dict.fromkeys(roots, NOT_YET_STORED)
    for doc in store.summaries(roots):
        statuses[doc["idempotency_key"]] = _status(doc)
        for child in doc.get("outbox", []):
            statuses.setdefault(child["idempotency_key"], NOT_YET_STORED)
    return statuses


def _status(doc: Mapping[str, Any]) -> str:
    if doc.get("event_status") == Status.FAILED and doc.get("retryable"):
        return "FAILED(retrying)"
    if doc.get("event_status") == Status.SUCCESS and doc.get("stale"):
        return STALE
    return str(doc.get("event_status"))


def status_counts(store: EventStore) -> dict[str, Any]:
    """``eventbus status --json``: events by type and status, and each FAILED one's error."""
    docs = store.summaries(None)
    rows = Counter((str(doc.get("event_type", "?")), _status(doc)) for doc in docs)
    counts: dict[str, dict[str, int]] = {}
    for (event_type, status), count in sorted(rows.items()):
        counts.setdefault(event_type, {})[status] = count
    failed = [{"key": doc["idempotency_key"],
               "error": (doc.get("error") or {}).get("message", "")}
              for doc in docs if doc.get("event_status") == Status.FAILED]
    return {"counts": counts, "failed": failed}


def status_table(store: EventStore, keys: Iterable[str] | None = None,
                 total: int | None = WIDTH) -> str:
    """Return a text table: one row per event type, one column per status.

    Below it, each FAILED event's key and error, and each unfinished rebuilt
    event; every line ``total`` columns at most (None: nothing cut).
    """
    docs = store.summaries(None if keys is None else set(keys))
    rows = Counter((doc.get("event_type", "?"), _status(doc)) for doc in docs)
    columns = sorted({status for _, status in rows})
    body = []
    for event_type in sorted({event_type for event_type, _ in rows}):
        counts = [rows[(event_type, column)] for column in columns]
        body.append([event_type, *counts, sum(counts)])
    lines = [f"  FAILED {safe(doc['idempotency_key'])}: "
              f"{safe((doc.get('error') or {}).get('message', ''))}"
              for doc in docs if doc.get("event_status") == Status.FAILED]
    lines += [f"  UNFINISHED {safe(doc['idempotency_key'])}: made by rebuild "
              f"{safe(str(doc.get('rebuild_made')))}, {safe(str(doc.get('event_status')))}; "
              f"no redrive runs it: eventbus rebuild --resume "
              f"{safe(str(doc.get('rebuild_made')))}"
              for doc in docs if rebuilds.made_unfinished(doc)]
    notes = lines if total is None else [clip(line, total) for line in lines]
    return "\n".join([table(["event_type", *columns, "total"], body, whole=(), total=total),
                      *notes])
