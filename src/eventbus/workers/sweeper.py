"""The sweepers' loops: ``eventbus relay`` and ``eventbus redrive``.

Each sweeper runs as a loop locally (a pass every ``interval`` seconds until
interrupted) and as a scheduled Cloud Run job (``--once``) in production:

* ``relay_pass``: the outbox relay's sweep (``eventbus.outbox.relay``), which
  publishes children left PENDING for longer than the grace period;
* ``redrive_pass``: the store-driven redrive (``eventbus.workers.redrive``),
  which publishes again what the broker left behind;
* ``repeat``: one pass, or a pass every ``interval`` seconds.

A pass reports on ``out`` (every pass with ``verbose``, else only the ones
that did something) and returns 1 when something is left for the next pass;
a store that is down is one line on ``err``, and the next pass retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

from eventbus.model.errors import EventBusError
from eventbus.outbox.relay import Relay, RelayReport
from eventbus.store.base import EventStore
from eventbus.workers.redrive import Redriver


def relay_pass(store: EventStore, relay: Relay, grace: timedelta, *, verbose: bool,
               out: TextIO, err: TextIO) -> int:
    """Run one outbox sweep and report it; return 1 if anything is left unpublished."""
    try:
        store.ensure_indexes()  # the sweep's query is pinned to the outbox index
        report = relay.sweep(grace)
    except EventBusError as exc:  # the store is down: the next pass retries
        print(f"eventbus relay: MongoDB is not available: {exc}", file=err)
        return 1
    if verbose or report != RelayReport():
        print(f"eventbus relay: {report}", file=out, flush=True)
    return 1 if report.failed else 0


def redrive_pass(redriver: Redriver, limit: int, *, verbose: bool, out: TextIO,
                 err: TextIO) -> int:
    """Run one redrive sweep and report it; return 1 when some could not be published."""
    try:
        report = redriver.sweep(limit)
    except EventBusError as exc:  # the store is down: the next pass retries
        print(f"eventbus redrive: {exc}", file=err)
        return 1
    if verbose or report.republished or report.abandoned or report.failed:
        print(f"eventbus redrive: {report}", file=out, flush=True)
    return 1 if report.failed else 0


def repeat(one_pass: Callable[[], int], *, once: bool, interval: float,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Run ``one_pass`` once (returning its status), or every ``interval`` seconds for good."""
    while True:
        code = one_pass()
        if once:
            return code
        sleep(interval)
