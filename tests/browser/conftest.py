"""The console in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

``browser`` (session): Chromium launched from ``/usr/bin/chromium`` (never a
downloaded build). ``console``: the console app on a free 127.0.0.1 port, over a
``MongoEventStore`` in a fresh database on the real server, whose publisher
hands each replayed message to the processor in the background, as the push
path would. Under ``CI=true`` a missing Chromium, Playwright or server fails
the test instead of skipping it (``tests/servers.py``).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database
from werkzeug.serving import make_server

from eventbus.model.delivery import Delivery
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store.mongo import MongoEventStore
from eventbus.testing import FakeClock
from eventbus.web.console import ConsoleConfig, create_console_app
from tests.ops.conftest import FIXED, Bus, routes
from tests.servers import unavailable

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "browser-token-0123456789"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        unavailable(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable(f"Playwright is not installed: {exc}")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield launched
        launched.close()


class Pusher:
    """A publisher that delivers each message to the processor a moment later, like a push."""

    def __init__(self, processor: Processor) -> None:
        self.processor, self.sent = processor, 0
        self.timers: list[threading.Timer] = []

    def close(self) -> None:
        """Wait for the deliveries still due, then close the processor (nothing outlives it)."""
        for timer in self.timers:
            timer.join()
        self.processor.close()

    def publish_message(self, data: bytes, attributes: Mapping[str, str], *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        self.sent += 1
        if topic is not None:  # a public topic: nothing here subscribes to it
            return f"public-{self.sent}"
        delivery = Delivery(data, dict(attributes), message_id=f"replay-{self.sent}",
                            subscription="projects/local-project/subscriptions/browser")
        timer = threading.Timer(0.3, self.processor.process, args=(delivery,))
        self.timers.append(timer)
        timer.start()
        return f"replay-{self.sent}"


@dataclass
class Console:
    url: str
    bus: Bus
    pusher: Pusher

    def signed_in(self, path: str = "/") -> str:
        return f"{self.url}{path}{'&' if '?' in path else '?'}token={TOKEN}"


@pytest.fixture()
def console(mongo_uri: str, mongo_db: Database) -> Iterator[Console]:
    FIXED.clear()
    settings = Settings(mongodb_uri=mongo_uri, mongodb_db=mongo_db.name, max_attempts=5)
    store = MongoEventStore.from_settings(settings)
    store.ensure_indexes()
    clock = FakeClock(dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))
    bus = Bus(store, clock, settings)
    pusher = Pusher(Processor(store, routes, settings, lambda: dt.datetime.now(dt.UTC)))
    app = create_console_app(store, ConsoleConfig(token=TOKEN), settings=settings,
                             publisher=lambda: pusher)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Console(f"http://127.0.0.1:{server.server_port}", bus, pusher)
    server.shutdown()
    thread.join()
    server.server_close()
    pusher.close()
    store.close()
