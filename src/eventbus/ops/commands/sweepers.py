"""``eventbus redrive [--once]``: the store-driven redrive sweeper (``eventbus.workers.redrive``).

Runs next to the outbox sweeper (``eventbus relay``): as a loop locally, as a
scheduled Cloud Run job (``--once``) in production. The loop and its report
are the worker's (``eventbus.workers.sweeper``); this module only parses the
command and builds the sweeper.
"""

from __future__ import annotations

import argparse
from typing import Any

from eventbus.ops.commands.common import APP_HELP, Tools, locator, positive
from eventbus.workers.redrive import Redriver
from eventbus.workers.sweeper import redrive_pass, repeat


def add(commands: Any) -> None:
    """Register ``redrive``."""
    redrive = commands.add_parser("redrive", help="publish again what the broker left behind")
    redrive.add_argument("--once", action="store_true", help="one pass, then exit")
    redrive.add_argument("--interval", type=positive, default=60,
                         help="seconds between passes (default 60)")
    redrive.add_argument("--limit", type=positive, default=500,
                         help="records per pass (default 500)")
    redrive.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP)")
    redrive.set_defaults(run=cmd_redrive)


def cmd_redrive(args: argparse.Namespace, tools: Tools) -> int:
    """Sweep once, or every ``--interval`` seconds until interrupted."""
    store = tools.store()
    redriver = Redriver(store, tools.publisher(), tools.settings, now=tools.now,
                        locate=locator(args.app or tools.ops.app, store))
    return repeat(lambda: redrive_pass(redriver, args.limit, verbose=args.once, out=tools.out,
                                       err=tools.err),
                  once=args.once, interval=args.interval)
