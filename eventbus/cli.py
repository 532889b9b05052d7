"""Command line: ``python -m eventbus publish|demo|status``.

* ``publish``: publish events from a JSON file or stdin (one event or a list).
* ``demo``: publish the sample batch and watch it being processed.
* ``status``: print the table of stored events by type and status.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from eventbus.config import Settings
from eventbus.errors import EventBusError
from eventbus.keys import rejected_key
from eventbus.publisher import Publisher, build_event, build_message
from eventbus.store import MongoEventStore

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "partner_events.json"
TERMINAL = ("SUCCESS", "FAILED")


def load_specs(source: str) -> list[dict[str, Any]]:
    """Read event specs from a path, or from stdin when ``source`` is ``-``."""
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"eventbus: {source} is not JSON: {exc}") from None
    specs = loaded if isinstance(loaded, list) else [loaded]
    if not all(isinstance(spec, dict) for spec in specs):
        raise SystemExit(f"eventbus: {source} must hold an event object or a list of them")
    return specs


def publish_spec(publisher: Publisher, spec: Mapping[str, Any]) -> str:
    """Publish one spec; return the idempotency key it will be stored under."""
    if "raw" in spec:
        data = str(spec["raw"]).encode()
        message_id = publisher.client.publish(publisher.topic_path, data).result(timeout=30)
        return rejected_key(data, {}, str(message_id))
    event = build_event(spec["event_type"], spec.get("data", {}), entity=spec["entity"],
                        version=spec.get("event_version", "v1"),
                        direction=spec.get("event_direction", "IN"))
    key = build_message(event, key=spec.get("idempotency_key"))[1]["idempotency_key"]
    publisher.publish_event(event, key=key, ordering_key=spec.get("ordering_key"))
    return key


def publish_all(publisher: Publisher, specs: Sequence[Mapping[str, Any]],
                out: TextIO) -> list[str]:
    """Publish every spec, reporting each; return their keys."""
    keys = []
    for number, spec in enumerate(specs, 1):
        try:
            keys.append(publish_spec(publisher, spec))
        except (EventBusError, KeyError) as exc:
            print(f"  #{number}: not published: {exc}", file=out)
            continue
        print(f"  #{number}: {spec.get('event_type', 'raw')} {keys[-1]}", file=out)
    return keys


def watch(store: MongoEventStore, keys: Iterable[str], timeout: float, out: TextIO) -> bool:
    """Show progress until every key is finished (or ``timeout``); True if all finished."""
    wanted, started = set(keys), time.monotonic()
    while True:
        statuses = _statuses(store, wanted)
        done = sum(1 for status in statuses.values() if status in TERMINAL)
        counts = Counter(statuses.values())
        bar = "#" * (30 * done // max(len(wanted), 1))
        print(f"\r  [{bar:<30}] {done}/{len(wanted)} finished  {dict(sorted(counts.items()))}"
              f"  {time.monotonic() - started:5.1f}s", end="", file=out, flush=True)
        if done == len(wanted) or time.monotonic() - started > timeout:
            print(file=out)
            return done == len(wanted)
        time.sleep(0.5)


def _statuses(store: MongoEventStore, keys: set[str]) -> dict[str, str]:
    found = store.collection.find({"idempotency_key": {"$in": sorted(keys)}},
                                  {"idempotency_key": 1, "event_status": 1, "retryable": 1})
    return {doc["idempotency_key"]: _status(doc) for doc in found}


def _status(doc: Mapping[str, Any]) -> str:
    if doc.get("event_status") == "FAILED" and doc.get("retryable"):
        return "FAILED(retrying)"
    return str(doc.get("event_status"))


def status_table(store: MongoEventStore, keys: Iterable[str] | None = None) -> str:
    """Return a text table: one row per event type, one column per status."""
    query = {} if keys is None else {"idempotency_key": {"$in": sorted(set(keys))}}
    docs = list(store.collection.find(query, {"event_type": 1, "event_status": 1,
                                              "retryable": 1, "error": 1, "idempotency_key": 1}))
    rows = Counter((doc.get("event_type", "?"), _status(doc)) for doc in docs)
    columns = sorted({status for _, status in rows})
    lines = [_row(["event_type", *columns, "total"])]
    for event_type in sorted({event_type for event_type, _ in rows}):
        counts = [rows[(event_type, column)] for column in columns]
        lines.append(_row([event_type, *map(str, counts), str(sum(counts))]))
    lines += [f"  FAILED {doc['idempotency_key']}: {doc.get('error', {}).get('message', '')}"
              for doc in docs if doc.get("event_status") == "FAILED"]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "  " + "".join(f"{cell:<20}" for cell in cells)


def cmd_publish(args: argparse.Namespace, settings: Settings) -> int:
    """Publish events from a file or stdin."""
    keys = publish_all(Publisher.from_settings(settings), load_specs(args.file), sys.stdout)
    return 0 if keys else 1


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Publish the sample batch, show progress, then the table of statuses."""
    specs = load_specs(args.file)
    print(f"publishing {len(specs)} sample messages to {settings.topic}")
    keys = publish_all(Publisher.from_settings(settings), specs, sys.stdout)
    store = MongoEventStore.from_settings(settings)
    print(f"waiting for {len(set(keys))} distinct events to be processed")
    finished = watch(store, keys, args.timeout, sys.stdout)
    print(status_table(store, keys))
    return 0 if finished else 1


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Print the status table of every stored event."""
    print(status_table(MongoEventStore.from_settings(settings)))
    return 0


def parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``python -m eventbus``."""
    root = argparse.ArgumentParser(prog="python -m eventbus", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = root.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish", help="publish events from a JSON file or stdin")
    publish.add_argument("file", help="path to a JSON event or list of events, or - for stdin")
    publish.set_defaults(run=cmd_publish)
    demo = commands.add_parser("demo", help="publish the sample batch and watch it")
    demo.add_argument("--file", default=str(SAMPLES))
    demo.add_argument("--timeout", type=float, default=120.0)
    demo.set_defaults(run=cmd_demo)
    commands.add_parser("status", help="table of stored events").set_defaults(run=cmd_status)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = parser().parse_args(argv)
    code: int = args.run(args, Settings.from_env())
    return code
