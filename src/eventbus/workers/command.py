"""``eventbus worker``: the pull worker, on the same app, router and settings as ``main:app``.

    eventbus worker [--app main:app] [--subscription NAME] [--batch-size 100]
                    [--batch-wait-ms 50] [--concurrency N] [--max-messages N]
                    [--max-bytes N] [--rate EVENTS_PER_SECOND]
                    [--lease-extension SECONDS]

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
from eventbus.processor import Processor
from eventbus.settings import SettingsError
from eventbus.workers.batch import BatchRunner
from eventbus.workers.metrics import WorkerMetrics
from eventbus.workers.pull import Inbox, PullWorker
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
    worker.add_argument("--app", default="main:app", help="MODULE:ATTR of the service app")
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


def service_of(app: Any, spec: str) -> Any:
    """The ``PushService`` an app from ``create_app`` carries; ``SettingsError`` if none."""
    service = getattr(app, "extensions", {}).get("eventbus")
    if service is None:
        raise SettingsError(f"{spec!r} is not an app made by eventbus.create_app")
    return service


def check_store(service: Any) -> None:
    """One read, so an unreachable store stops the worker before it pulls anything."""
    try:
        service.store.get("eventbus-worker-start-check")
    except StoreUnavailable as exc:
        raise SettingsError(f"the store is unreachable: {exc}") from None


def runner_of(service: Any, concurrency: int) -> BatchRunner:
    """The batch runner on the service's processor (router, settings, relay, telemetry)."""
    processor: Processor = service.processor
    return BatchRunner(processor, concurrency=concurrency)


def run(args: argparse.Namespace, tools: Any, load_app: Any) -> int:
    """Check, subscribe, and run batches until SIGTERM or Ctrl-C."""
    from eventbus.workers.subscriber import Subscription

    service = service_of(load_app(args.app), args.app)
    check_store(service)
    name = args.subscription or tools.ops.pull_subscription
    subscription = Subscription.open(tools.settings.project_id, name)  # SettingsError if absent
    worker = PullWorker(runner_of(service, args.concurrency), Inbox(),
                        subscription=subscription.path, batch_size=args.batch_size,
                        batch_wait=args.batch_wait_ms / 1000, rate=RateLimit(args.rate),
                        exactly_once=subscription.exactly_once,
                        metrics=WorkerMetrics(getattr(service.processor.telemetry, "meter",
                                                      None)))
    _on_signals(worker.stop)
    print(f"eventbus worker: pulling {subscription.path} (batches of {args.batch_size}"
          f"{', exactly-once' if subscription.exactly_once else ''})", file=tools.err,
          flush=True)
    with subscription.streaming(worker.inbox, args.max_messages or 2 * args.batch_size,
                                args.max_bytes, args.lease_extension):
        counters = worker.run()
    worker.runner.close()
    print(f"eventbus worker: stopped after {counters.batches} batches, {counters.acked} acked, "
          f"{counters.nacked} nacked, {counters.failed_acks} failed acks", file=tools.err)
    return 0


def _on_signals(stop: Any) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signals can be handled by the main thread only (tests run it elsewhere)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: stop())
