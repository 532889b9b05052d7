"""The ``eventbus`` console script: publish, look, repair.

Reads the same settings as the service (``Settings.from_env``), after
loading the nearest ``.env`` (``eventbus.ops.config.load_env_file``, with
python-dotenv; the real environment wins), and reaches the events only
through the store protocol. Every stored value it prints is escaped
(``eventbus.ops.render``).

The operator commands (seed 002's queries, replay, the dead-letter drain,
the console) live in ``eventbus.ops.commands``; ``eventbus COMMAND --help``
tells each one's options:

* ``failed``, ``history --partner ID``, ``show KEY``, ``stats``, ``retries``;
* ``rebuild FILTERS|--keys FILE|--resume ID`` (replay mode over SUCCESS events,
  ``eventbus.rebuild.runner``);
* ``replay KEY...|--group ID|FILTERS``, ``dlq drain`` (the drain is a
  worker's, ``eventbus.workers.deadletter``);
* ``console [--port N] [--read-only]``;
* ``redrive [--once]`` (the sweeper, ``eventbus.workers.redrive``), ``worker``
  (the pull worker, ``eventbus.workers.pull``);
* ``contracts write|check``, ``peek TOPIC``: public topics
  (``eventbus.ops.commands.public``);
* ``partners``, ``partners open|close NAME --why ...``: partner breakers,
  parked events and rates (``eventbus.partners.command``).

The commands of the bus itself:

* ``publish FILE|-``: publish events from a JSON file or stdin (one event or a
  list). Each published event prints ``#N TYPE KEY`` on stdout; each event
  that is not published prints one line on stderr and the rest go on (one
  larger than the service stores is refused before sending, the line naming
  its size and the limit).
  Exit 0 when all were published, 1 when some were not, 2 when the input
  cannot be read at all (unreadable file, not JSON, not event objects).
* ``status``: print the table of stored events by type and status.
* ``relay [--once] [--interval S] [--grace S]``: the outbox sweeper
  (``eventbus.workers.sweeper``); publish children left PENDING for longer
  than the grace period. Exit 1 (with ``--once``) when some could not be
  published.
* ``trace KEY``: print the cascade that KEY belongs to, from its root, with
  each event's status and publish state. Exit 1 when KEY is unknown.

An event spec is ``{"event_type", "entity": {partnerId, entity_id,
entity_type, partnerName?}, "data"?, "event_version"?, "event_direction"?,
"idempotency_key"?, "ordering_key"?}``; ``{"raw": "..."}`` publishes a string
as it is (to show how invalid payloads are stored). Specs are read and
published by ``eventbus.ops.specs``; the status table is ``eventbus.ops.progress``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence

from eventbus.model.errors import EventBusError, PublishError
from eventbus.ops import cascade
from eventbus.ops.commands import console, public, queries, repair, sweepers
from eventbus.ops.commands.common import (
    Tools,
    UsageError,
    add_table_options,
    load_router,
    positive,
    width_of,
)
from eventbus.ops.config import OpsSettings, load_env_file
from eventbus.ops.progress import status_counts, status_table
from eventbus.ops.render import safe
from eventbus.ops.specs import InputError, load_specs, publish_all
from eventbus.outbox.relay import Relay
from eventbus.partners import command as partners_command
from eventbus.pubsub.message import MessagePublisher
from eventbus.rebuild import command as rebuild_command
from eventbus.rebuild.verify import command as verify_command
from eventbus.settings import Settings, SettingsError
from eventbus.store.base import EventStore
from eventbus.workers import command as worker
from eventbus.workers import sweeper


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
    """Print the status table of every stored event (``--wide``: nothing cut; ``--json``)."""
    store = tools.store()
    if getattr(args, "json", False):
        tools.emit(status_counts(store), "", args)
    else:
        print(status_table(store, total=width_of(args)), file=tools.out)
    return 0


def cmd_relay(args: argparse.Namespace, tools: Tools) -> int:
    """Run the outbox sweeper once, or every ``--interval`` seconds until interrupted."""
    store = tools.store()
    # ``published_at`` and the grace are on the store's clock, as every stamp a record holds.
    relay = Relay(store, tools.publisher(), now=tools.now)
    grace = dt.timedelta(seconds=args.grace)
    return sweeper.repeat(lambda: sweeper.relay_pass(store, relay, grace, verbose=args.once,
                                                     out=tools.out, err=tools.err),
                          once=args.once, interval=args.interval)


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
    status = commands.add_parser("status", help="table of stored events")
    add_table_options(status)
    status.set_defaults(run=cmd_status)
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
    for module in (queries, repair, rebuild_command, console, sweepers, public,
                   partners_command, verify_command):
        module.add(commands)
    # The worker's router comes from the same loader as every other --app (its own
    # router_in then finds the Router as it is).
    worker.add(commands, positive, load_router)
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
        load_env_file()
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
