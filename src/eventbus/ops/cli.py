"""The ``eventbus`` console script: publish, look, repair.

Reads the same settings as the service (``Settings.from_env``), after
loading the nearest ``.env`` (``eventbus.ops.dotenv``; the real environment
wins), and reaches the events only through the store protocol. Every stored
value it prints is escaped (``eventbus.ops.render``).

The operator commands (seed 002's queries, replay, the dead-letter drain,
the console) live in ``eventbus.ops.commands``; ``eventbus COMMAND --help``
tells each one's options:

* ``failed``, ``history --partner ID``, ``show KEY``, ``stats``, ``retries``;
* ``replay KEY...|--group ID|FILTERS``, ``dlq drain``;
* ``console [--port N] [--read-only]``;
* ``redrive [--once]``, ``worker`` (the pull worker, ``eventbus.workers``);
* ``contracts write|check``, ``peek TOPIC``: public topics
  (``eventbus.ops.commands.public``).

The commands of the bus itself:

* ``publish FILE|-``: publish events from a JSON file or stdin (one event or a
  list). Each published event prints ``#N TYPE KEY`` on stdout; each event
  that is not published prints one line on stderr and the rest go on.
  Exit 0 when all were published, 1 when some were not, 2 when the input
  cannot be read at all (unreadable file, not JSON, not event objects).
* ``status``: print the table of stored events by type and status.
* ``relay [--once] [--interval S] [--grace S]``: the outbox sweeper; publish
  children left PENDING for longer than the grace period. Exit 1 (with
  ``--once``) when some could not be published.
* ``trace KEY``: print the cascade that KEY belongs to, from its root, with
  each event's status and publish state. Exit 1 when KEY is unknown.

An event spec is ``{"event_type", "entity": {partnerId, entity_id,
entity_type, partnerName?}, "data"?, "event_version"?, "event_direction"?,
"idempotency_key"?, "ordering_key"?}``; ``{"raw": "..."}`` publishes a string
as it is (to show how invalid payloads are stored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from eventbus.model.errors import EventBusError, InvalidEvent, PublishError
from eventbus.model.event import Event
from eventbus.model.keys import record_key, rejected_key
from eventbus.model.status import Status
from eventbus.ops import cascade, dotenv, jsonfile
from eventbus.ops.commands import console, public, queries, repair, sweepers
from eventbus.ops.commands.common import Tools, UsageError, load_app, positive
from eventbus.ops.config import OpsSettings
from eventbus.ops.render import safe
from eventbus.outbox.relay import Relay, RelayReport
from eventbus.pubsub.message import MessagePublisher, build_event, build_message
from eventbus.settings import Settings, SettingsError
from eventbus.store.base import EventStore
from eventbus.workers import command as worker

TERMINAL = (Status.SUCCESS, Status.FAILED)
PROGRESS_EVERY = 100
# After this many publish failures in a row Pub/Sub is taken to be down, and
# the rest of the batch is not tried (each try would wait for its timeout).
MAX_FAILURES_IN_A_ROW = 3
SPEC_FIELDS = ("event_type", "entity")


class InputError(Exception):
    """Raised when the events to publish cannot be read; exit status 2."""


def load_specs(source: str) -> list[dict[str, Any]]:
    """Read event specs from a path, or from stdin when ``source`` is ``-``."""
    try:
        loaded = jsonfile.loads(jsonfile.read_text(source), source)
    except jsonfile.Unreadable as exc:
        raise InputError(str(exc)) from None
    specs = loaded if isinstance(loaded, list) else [loaded]
    if not specs:
        raise InputError(f"{source} holds an empty list: nothing to publish")
    for number, spec in enumerate(specs, 1):
        if not isinstance(spec, dict):
            raise InputError(f"{source}: event #{number} is {type(spec).__name__}, "
                             "not an event object")
    return specs


def spec_event(spec: Mapping[str, Any]) -> Event:
    """Return the validated event of a spec, or raise ``InvalidEvent`` saying what is wrong."""
    missing = [name for name in SPEC_FIELDS if name not in spec]
    if missing:
        raise InvalidEvent(f"missing {' and '.join(missing)}")
    return build_event(spec["event_type"], spec.get("data", {}), entity=spec["entity"],
                       version=spec.get("event_version", "v1"),
                       direction=spec.get("event_direction", "IN"))


def publish_spec(publisher: MessagePublisher, spec: Mapping[str, Any]) -> str:
    """Publish one spec; return the idempotency key it will be stored under."""
    if "raw" in spec:
        data = str(spec["raw"]).encode()
        return rejected_key(data, publisher.publish_message(data, {}))
    event = spec_event(spec)
    given, ordering = _optional_text(spec, "idempotency_key"), _optional_text(spec, "ordering_key")
    data, attributes = build_message(event, key=given)
    publisher.publish_message(data, attributes, ordering_key=ordering)
    return record_key(event, attributes)


def _optional_text(spec: Mapping[str, Any], name: str) -> str | None:
    value = spec.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidEvent(f"{name} must be a string, got {type(value).__name__}")
    return value


def publish_all(publisher: MessagePublisher, specs: Sequence[Mapping[str, Any]], out: TextIO,
                err: TextIO | None = None) -> list[str]:
    """Publish every spec, reporting each; return the keys of those published."""
    err = err or sys.stderr
    keys: list[str] = []
    in_a_row = 0
    for number, spec in enumerate(specs, 1):
        try:
            keys.append(publish_spec(publisher, spec))
            in_a_row = 0
            print(f"  #{number}: {spec.get('event_type', 'raw')} {keys[-1]}", file=out)
        except EventBusError as exc:
            print(f"eventbus: event #{number} not published: {exc}", file=err)
            in_a_row = in_a_row + 1 if isinstance(exc, PublishError) else 0
            if in_a_row >= MAX_FAILURES_IN_A_ROW:
                print(f"eventbus: {in_a_row} publish failures in a row; "
                      f"events #{number + 1}-#{len(specs)} not tried", file=err)
                break
        _progress(number, len(specs), len(keys), err)
    return keys


def _progress(done: int, total: int, published: int, err: TextIO) -> None:
    if total > PROGRESS_EVERY and (done % PROGRESS_EVERY == 0 or done == total):
        print(f"eventbus: {done}/{total} done, {published} published", file=err, flush=True)


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
    statuses = dict.fromkeys(roots, "NOT YET STORED")
    for doc in store.summaries(roots):
        statuses[doc["idempotency_key"]] = _status(doc)
        for child in doc.get("outbox", []):
            statuses.setdefault(child["idempotency_key"], "NOT YET STORED")
    return statuses


def _status(doc: Mapping[str, Any]) -> str:
    if doc.get("event_status") == Status.FAILED and doc.get("retryable"):
        return "FAILED(retrying)"
    return str(doc.get("event_status"))


def status_table(store: EventStore, keys: Iterable[str] | None = None) -> str:
    """Return a text table: one row per event type, one column per status."""
    docs = store.summaries(None if keys is None else set(keys))
    rows = Counter((doc.get("event_type", "?"), _status(doc)) for doc in docs)
    columns = sorted({status for _, status in rows})
    lines = [_row(["event_type", *columns, "total"])]
    for event_type in sorted({event_type for event_type, _ in rows}):
        counts = [rows[(event_type, column)] for column in columns]
        lines.append(_row([event_type, *map(str, counts), str(sum(counts))]))
    lines += [f"  FAILED {safe(doc['idempotency_key'])}: "
              f"{safe((doc.get('error') or {}).get('message', ''))}"
              for doc in docs if doc.get("event_status") == Status.FAILED]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "  " + "".join(f"{safe(cell):<20}" for cell in cells)


def publisher(settings: Settings, timeout: float = 30.0) -> MessagePublisher:
    """Return the publisher of ``settings``; ``PublishError`` when it cannot be built."""
    from eventbus.pubsub.publisher import Publisher

    try:
        return Publisher.from_settings(settings, timeout=timeout)
    except Exception as exc:  # credentials or project: one line, not a traceback
        raise PublishError(f"cannot publish to {settings.topic}: {exc}") from exc


def open_store(settings: Settings) -> EventStore:
    """Return the MongoDB store of ``settings``; ``StoreUnavailable`` for a bad URI."""
    from eventbus.store.mongo import MongoEventStore

    return MongoEventStore.from_settings(settings)


def cmd_publish(args: argparse.Namespace, tools: Tools) -> int:
    """Publish events from a file or stdin."""
    settings = tools.settings
    specs = load_specs(args.file)
    keys = publish_all(tools.publisher(args.timeout), specs, sys.stdout)
    print(f"eventbus: published {len(keys)} of {len(specs)} events to {settings.topic}",
          file=sys.stderr)
    return 0 if len(keys) == len(specs) else 1


def cmd_status(args: argparse.Namespace, tools: Tools) -> int:
    """Print the status table of every stored event."""
    print(status_table(tools.store()))
    return 0


def cmd_relay(args: argparse.Namespace, tools: Tools) -> int:
    """Run the outbox sweeper once, or every ``--interval`` seconds until interrupted."""
    store = tools.store()
    relay = Relay(store, tools.publisher(), now=lambda: dt.datetime.now(dt.UTC))
    grace = dt.timedelta(seconds=args.grace)
    while True:
        code = sweep_once(store, relay, grace, verbose=args.once)
        if args.once:
            return code
        time.sleep(args.interval)


def sweep_once(store: EventStore, relay: Relay, grace: dt.timedelta, *,
               verbose: bool) -> int:
    """Run one sweep and report it; return 1 if anything is left unpublished."""
    try:
        store.ensure_indexes()  # the sweep's query is pinned to the outbox index
        report = relay.sweep(grace)
    except EventBusError as exc:  # the store is down: the next pass retries
        print(f"eventbus relay: MongoDB is not available: {exc}", file=sys.stderr)
        return 1
    if verbose or report != RelayReport():
        print(f"eventbus relay: {report}", flush=True)
    return 1 if report.failed else 0


def cmd_trace(args: argparse.Namespace, tools: Tools) -> int:
    """Print the cascade of ``args.key`` from its root."""
    tree = cascade.load(tools.store(), args.key)
    if tree is None:
        print(f"eventbus: no event with idempotency key {safe(args.key)!r}", file=sys.stderr)
        return 1
    print(cascade.render(tree, marked=args.key))
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``python -m eventbus``."""
    root = argparse.ArgumentParser(prog="eventbus", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = root.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish", help="publish events from a JSON file or stdin")
    publish.add_argument("file", help="path to a JSON event or list of events, or - for stdin")
    publish.add_argument("--timeout", type=_seconds, default=10.0,
                         help="seconds to wait for Pub/Sub per event (default 10)")
    publish.set_defaults(run=cmd_publish)
    commands.add_parser("status", help="table of stored events").set_defaults(run=cmd_status)
    relay = commands.add_parser("relay", help="the outbox sweeper: publish pending children")
    relay.add_argument("--once", action="store_true", help="one pass, then exit")
    relay.add_argument("--interval", type=_seconds, default=10.0,
                       help="seconds between passes (default 10)")
    relay.add_argument("--grace", type=_seconds, default=30.0,
                       help="leave entries younger than this to the inline relay (default 30)")
    relay.set_defaults(run=cmd_relay)
    trace_ = commands.add_parser("trace", help="print the cascade of an event from its root")
    trace_.add_argument("key", help="the idempotency key of any event of the cascade")
    trace_.set_defaults(run=cmd_trace)
    for module in (queries, repair, console, sweepers, public):
        module.add(commands)
    worker.add(commands, positive, load_app)
    return root


def tools(settings: Settings) -> Tools:
    """Return the tools of the commands: this module's ``open_store`` and ``publisher``.

    Looked up at call time, so a test can swap either for a fake.
    """
    return Tools(settings, OpsSettings.from_env(settings),
                 open_store=lambda: open_store(settings),
                 open_publisher=lambda timeout: publisher(settings, timeout))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Run as a program (no ``argv``), it first loads the nearest ``.env``; a
    caller that passes ``argv`` chose its environment already.
    """
    if argv is None:
        dotenv.load()
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args, tools(Settings.from_env()))
    except (InputError, SettingsError, UsageError) as exc:
        print(f"eventbus: {safe(exc)}", file=sys.stderr)
        return 2
    except EventBusError as exc:
        print(f"eventbus: {safe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
