"""The local demo: publish the sample batch and watch it being processed.

    python -m handlers.demo [--reset] [--file FILE] [--timeout S]

Uses the library's public modules: event specs (``eventbus.ops.specs``), the
publisher, the MongoDB store and the progress view (``eventbus.ops.progress``);
``--reset`` empties the demo's own database first (``make run`` gives the demo
a database of its own).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from eventbus.model.errors import EventBusError, PublishError
from eventbus.ops.progress import status_table, watch
from eventbus.ops.specs import InputError, load_specs, publish_all
from eventbus.pubsub.message import MessagePublisher
from eventbus.pubsub.publisher import Publisher
from eventbus.settings import Settings, SettingsError
from eventbus.store.mongo import MongoEventStore

SAMPLES = Path(__file__).resolve().parent / "samples" / "partner_events.json"


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Publish the sample batch, show progress, then the table of statuses."""
    specs = load_specs(args.file)
    store = MongoEventStore.from_settings(settings)
    if args.reset:
        store.reset()
        print(f"emptied database {settings.mongodb_db!r}")
    print(f"publishing {len(specs)} sample messages to {settings.topic}")
    keys = publish_all(publisher(settings), specs, sys.stdout)
    print(f"waiting for {len(set(keys))} distinct events and the cascades they start")
    finished = watch(store, keys, args.timeout, sys.stdout)
    print(status_table(store, keys))
    return 0 if finished else 1


def publisher(settings: Settings) -> MessagePublisher:
    """Return the publisher of ``settings``; ``PublishError`` when it cannot be built."""
    try:
        return Publisher.from_settings(settings)
    except Exception as exc:  # credentials or project: one line, not a traceback
        raise PublishError(f"cannot publish to {settings.topic}: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m handlers.demo", description=__doc__)
    parser.add_argument("--file", default=str(SAMPLES))
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--reset", action="store_true",
                        help="empty the database first (local demo databases only)")
    args = parser.parse_args(argv)
    try:
        return run(args, Settings.from_env())
    except (InputError, SettingsError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except EventBusError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
