"""Operator tests on the real MongoDB-compatible server: records made by the real processor.

``bus`` is a ``MongoEventStore`` in a fresh database, a processor with the
test router below, a clock that starts two hours ago (the server's TTL
monitor would delete records from the past), and ``run(argv)``: the
``eventbus`` console script on that store, with a capturing publisher.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pymongo.database import Database

from eventbus import Context, PermanentError, Router
from eventbus.model.delivery import Delivery
from eventbus.ops import cli
from eventbus.processor import Processor, Result
from eventbus.pubsub.message import build_event, build_message
from eventbus.settings import Settings
from eventbus.store.mongo import MongoEventStore
from eventbus.testing import CapturingPublisher, FakeClock

OPS_VARIABLES = ("EVENTBUS_APP", "EVENTBUS_OPERATOR", "EVENTBUS_REPLAY_CONFIRM_ABOVE",
                 "PUBSUB_DEAD_LETTER_SUBSCRIPTION", "PUBSUB_SUBSCRIPTION", "MONGODB_DB",
                 "EVENTBUS_MAX_ATTEMPTS", "EVENTBUS_CONSOLE_TOKEN", "PUBSUB_TOPIC")

# Handlers whose behaviour the test switches: ``FIXED`` lists the tags that now succeed.
FIXED: set[str] = set()
routes = Router()


@routes.handler("OR_MGMT", versions=("v1", "v2"))
def order(context: Context) -> None:
    """Succeed, fail for good, or fail transiently, as ``entity_data.mode`` says."""
    data = context.event.entity_data
    if data.get("tag") in FIXED:
        context.db["ops_effects"].update_one({"_id": data["tag"]}, {"$inc": {"runs": 1}},
                                             upsert=True)
        return
    if data.get("mode") == "permanent":
        raise PermanentError(f"no such order {data.get('orderId')}")
    if data.get("mode") == "transient":
        raise ConnectionError(f"partner timed out after {data.get('orderId')} ms")


@routes.handler("SUB_MGMT")
def subscription(context: Context) -> None:
    """Always succeeds."""


@routes.handler("POS_MGMT", ordered_by="entity_data.ts")
def position(context: Context) -> None:
    """Ordered by ``entity_data.ts``: an older event of its entity is stored as stale."""


@dataclass
class Bus:
    store: MongoEventStore
    clock: FakeClock
    settings: Settings
    publisher: CapturingPublisher = field(default_factory=CapturingPublisher)
    count: int = 0

    def deliver(self, event_type: str = "OR_MGMT", partner: str = "p-1", *,
                key: str | None = None, raw: bytes | None = None, **data: Any) -> Result:
        """Process one message through the real processor; the clock moves a second."""
        self.count += 1
        if raw is not None:
            body, attributes = raw, {}
        else:
            entity = {"partnerId": partner, "entity_id": f"order-{self.count}",
                      "entity_type": "Order", "partnerName": "Acme"}
            event = build_event(event_type, data, entity=entity)
            body, attributes = build_message(event, key=key)
        result = self.redeliver(body, attributes, f"m-{self.count}")
        self.clock.advance(1)
        return result

    def redeliver(self, body: bytes, attributes: dict[str, str], message_id: str) -> Result:
        """Process one message on a processor of its own (as a fresh instance would), closed
        after it."""
        delivery = Delivery(body, attributes, message_id=message_id,
                            subscription="projects/local-project/subscriptions/s")
        with contextlib.closing(Processor(self.store, routes, self.settings, self.clock)) as run:
            return run.process(delivery)

    def replayed(self) -> list[Result]:
        """Push every message the capturing publisher holds through the processor."""
        return [self.redeliver(m.data, dict(m.attributes), f"r-{n}")
                for n, m in enumerate(self.publisher.take())]

    def run(self, *argv: str, stdin: str = "") -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cli, "open_store", lambda settings: self.store)
            patch.setattr(cli, "publisher", lambda settings, timeout=30.0: self.publisher)
            patch.setattr("sys.stdout", out)
            patch.setattr("sys.stderr", err)
            patch.setattr("sys.stdin", io.StringIO(stdin))
            code = cli.main(list(argv))
        return code, out.getvalue(), err.getvalue()

    def json(self, *argv: str) -> Any:
        code, out, err = self.run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture()
def bus(mongo_uri: str, mongo_db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bus]:
    for name in OPS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    FIXED.clear()
    settings = Settings(mongodb_uri=mongo_uri, mongodb_db=mongo_db.name, max_attempts=5)
    monkeypatch.setenv("MONGODB_DB", mongo_db.name)
    monkeypatch.setenv("EVENTBUS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("EVENTBUS_OPERATOR", "ops@example.com")
    store = MongoEventStore.from_settings(settings)
    store.ensure_indexes()
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    yield Bus(store, FakeClock(start), settings)
    store.close()
