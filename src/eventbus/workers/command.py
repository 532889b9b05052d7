"""``eventbus worker``: the pull worker, on the same router and settings as the push app.

    eventbus worker [--app handlers:create_router] [--subscription NAME] [--batch-size 100]
                    [--batch-wait-ms 50] [--concurrency N] [--max-messages N]
                    [--max-bytes N] [--rate EVENTS_PER_SECOND]
                    [--lease-extension SECONDS]

``--app`` names the app's ``Router``, a function returning one, or (loading
Flask with it) an app made by ``create_app``. The worker is built by
``create_worker`` from that router and the settings: no web app, no Flask.
Run from the project root (the app is imported from there, as gunicorn does),
with the service's environment (``MONGODB_URI``, ``PUBSUB_EMULATOR_HOST``,
``GOOGLE_CLOUD_PROJECT``, ...; ``.env`` is loaded like every ``eventbus``
command). Before pulling anything it checks the app, the store and the
subscription, and stops with one line (exit 2) when one is missing.
SIGTERM or Ctrl-C stop it cleanly (exit 0): see ``eventbus.workers.pull``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from eventbus.model.errors import StoreUnavailable
from eventbus.model.router import Router
from eventbus.settings import SettingsError
from eventbus.workers.pull import PullWorker, create_worker
from eventbus.workers.rate import RateLimit

MB = 1024 * 1024
# The client library extends the ack deadline of every message it holds by up to
# the 99th percentile of its ack latency (at most 600 s). A SIGKILLed worker's
# messages are redelivered only when that deadline runs out, so the extension is
# capped: a minute bounds the wait after a crash, at one modack a minute per message.
LEASE_EXTENSION = 60


def add(commands: Any, positive: Any, load_app: Any) -> None:
    """Register ``worker`` on the ``eventbus`` sub-parsers."""
    worker = commands.add_parser("worker", help="the pull worker: batches from a subscription")
    worker.add_argument("--app", default="handlers:create_router",
                        help="MODULE:ATTR of the app's Router, a function returning one, "
                             "or an app from create_app (default handlers:create_router)")
    worker.add_argument("--subscription",
                        help="default $EVENTBUS_PULL_SUBSCRIPTION, else <topic>-pull")
    worker.add_argument("--batch-size", type=positive, default=100)
    worker.add_argument("--batch-wait-ms", type=positive, default=50,
                        help="how long a batch waits to fill once a message came")
    worker.add_argument("--concurrency", type=positive, default=1, help="handler threads")
    worker.add_argument("--max-messages", type=positive,
                        help="flow control: messages held at once (default 2 x batch size)")
    worker.add_argument("--max-bytes", type=positive, default=100 * MB,
                        help="flow control: bytes held at once (default 100 MB)")
    worker.add_argument("--rate", type=_rate, help="at most this many events per second")
    worker.add_argument("--lease-extension", type=positive, default=LEASE_EXTENSION,
                        help="the longest ack-deadline extension asked for at once: after a "
                             "crash, the worker's messages come back within it (default 60 s)")
    worker.set_defaults(run=lambda args, tools: run(args, tools, load_app))


def _rate(text: str) -> float:
    try:
        value = float(text.removesuffix("/s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (e.g. 50 or 50/s)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("the rate must be above 0")
    return value


def router_in(found: Any) -> Router | None:
    """The router ``found`` stands for: a ``Router``, a function returning one, or an app's."""
    service = getattr(found, "extensions", {}).get("eventbus")
    if service is not None:
        found = service.processor.router
    elif callable(found) and not isinstance(found, Router):
        found = found()
    return found if isinstance(found, Router) else None


def router_of(spec: str, load_app: Any) -> Router:
    """The router ``--app`` names; ``SettingsError`` when it names none."""
    router = router_in(load_app(spec))
    if router is None:
        raise SettingsError(f"{spec!r} is not a Router, a function returning one, "
                            "or an app made by eventbus.create_app")
    return router


def check_store(worker: PullWorker) -> None:
    """Ensure the indexes (as the app does), so an unreachable store stops the worker at once.

    The batch claim relies on the unique index of the idempotency key: a
    worker that started on an empty database must create it before pulling.
    """
    try:
        worker.processor.ensure_indexes()
    except StoreUnavailable as exc:
        raise SettingsError(f"the store is unreachable: {exc}") from None


def run(args: argparse.Namespace, tools: Any, load_app: Any) -> int:
    """Check, subscribe, and run batches until SIGTERM or Ctrl-C."""
    from eventbus.workers.subscriber import Subscription

    router = router_of(args.app, load_app)
    name = args.subscription or tools.ops.pull_subscription
    subscription = Subscription.open(tools.settings.project_id, name)  # SettingsError if absent
    worker = create_worker(router, tools.settings, subscription=subscription.path,
                           batch_size=args.batch_size, batch_wait=args.batch_wait_ms / 1000,
                           concurrency=args.concurrency, rate=RateLimit(args.rate),
                           exactly_once=subscription.exactly_once)
    check_store(worker)
    _on_signals(worker.stop)
    print(f"eventbus worker: pulling {subscription.path} (batches of {args.batch_size}"
          f"{', exactly-once' if subscription.exactly_once else ''})", file=tools.err,
          flush=True)
    with subscription.streaming(worker.inbox, args.max_messages or 2 * args.batch_size,
                                args.max_bytes, args.lease_extension):
        counters = worker.run()
    worker.processor.close()
    print(f"eventbus worker: stopped after {counters.batches} batches, {counters.acked} acked, "
          f"{counters.nacked} nacked, {counters.failed_acks} failed acks", file=tools.err)
    return 0


def _on_signals(stop: Any) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signals can be handled by the main thread only (tests run it elsewhere)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: stop())
