"""``eventbus redrive [--once]``: the store-driven redrive sweeper (``eventbus.ops.redrive``).

Runs next to the outbox sweeper (``eventbus relay``): as a loop locally, as a
scheduled Cloud Run job (``--once``) in production.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from eventbus.model.errors import EventBusError
from eventbus.ops.commands.common import Tools, locator, positive
from eventbus.ops.redrive import Redriver


def add(commands: Any) -> None:
    """Register ``redrive``."""
    redrive = commands.add_parser("redrive", help="publish again what the broker left behind")
    redrive.add_argument("--once", action="store_true", help="one pass, then exit")
    redrive.add_argument("--interval", type=positive, default=60,
                         help="seconds between passes (default 60)")
    redrive.add_argument("--limit", type=positive, default=500,
                         help="records per pass (default 500)")
    redrive.add_argument("--app", help="MODULE:ATTR of the service app (default $EVENTBUS_APP)")
    redrive.set_defaults(run=cmd_redrive)


def cmd_redrive(args: argparse.Namespace, tools: Tools) -> int:
    """Sweep once, or every ``--interval`` seconds until interrupted."""
    store = tools.store()
    redriver = Redriver(store, tools.publisher(), tools.settings, now=tools.now,
                        locate=locator(args.app or tools.ops.app, store))
    while True:
        code = sweep_once(redriver, args.limit, tools, verbose=args.once)
        if args.once:
            return code
        time.sleep(args.interval)


def sweep_once(redriver: Redriver, limit: int, tools: Tools, *, verbose: bool) -> int:
    """Run one pass and report it; 1 when some could not be published."""
    try:
        report = redriver.sweep(limit)
    except EventBusError as exc:  # the store is down: the next pass retries
        print(f"eventbus redrive: {exc}", file=tools.err)
        return 1
    if verbose or report.republished or report.abandoned or report.failed:
        print(f"eventbus redrive: {report}", file=tools.out, flush=True)
    return 1 if report.failed else 0
