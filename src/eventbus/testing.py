"""Test tooling that ships with the library: run handlers and cascades with no server.

``LocalBus`` is the sync guide's "simplified backend for local development
or unit tests": given a router (and optionally a store, by default
in-memory), ``publish(...)`` takes the same arguments as ``eventbus.publish``
and runs the event, and every child it emits, in-process and synchronously,
through the same processor and relay as the service, with a fake clock and
a capturing publisher (``async def`` handlers are awaited on the processor's
event loop, as in the service; ``close()``, or ``with LocalBus(...) as bus``,
ends it)::

    bus = LocalBus(routes)
    key = bus.publish("OR_MGMT", {...}, entity={...})
    assert bus.record(key)["event_status"] == "SUCCESS"
    print(bus.cascade(key))

Also here: ``FakeClock`` (moved by hand, nothing sleeps), ``CapturingPublisher``
(keeps what it would have sent) and ``push_body`` (a wrapped push request body).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import Classifier, PublishError
from eventbus.model.keys import record_key
from eventbus.model.router import Router
from eventbus.ops import cascade
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners
from eventbus.processor import Processor, Result
from eventbus.pubsub.message import Entity, build_event, build_message
from eventbus.settings import Settings
from eventbus.store.base import EventStore, Record
from eventbus.store.memory import MemoryEventStore
from eventbus.telemetry import Telemetry


class FakeClock:
    """A clock the test moves by hand; nothing sleeps."""

    def __init__(self, start: dt.datetime = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)) -> None:
        self.moment = start

    def __call__(self) -> dt.datetime:
        """Return the current fake time."""
        return self.moment

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.moment += dt.timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock: move it and return at once (``eventbus.partners``)."""
        self.advance(seconds)

    def monotonic(self) -> float:
        """Seconds on this clock, for code that times its own waits."""
        return self.moment.timestamp()


@dataclasses.dataclass(frozen=True)
class Message:
    """One captured message, as Pub/Sub would have pushed it."""

    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    timeout: float | None
    topic: str | None = None
    """The public topic it went to; None for the event bus."""


class CapturingPublisher:
    """A publisher that keeps the messages instead of sending them.

    ``failures`` publishes fail first (``PublishError``); ``on_publish`` is
    called before each try, so a test can move a fake clock.
    """

    def __init__(self, failures: int = 0, on_publish: Callable[[], None] | None = None) -> None:
        self.messages: list[Message] = []
        self.tries = 0
        self.failures = failures
        self.on_publish = on_publish
        self._ids = itertools.count(1)

    def publish_message(self, data: bytes, attributes: Mapping[str, str] | None = None, *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        """Keep the message (or fail, while ``failures`` last); return its id."""
        self.tries += 1
        if self.on_publish is not None:
            self.on_publish()
        if self.failures > 0:
            self.failures -= 1
            raise PublishError("injected publish failure")
        message = Message(f"msg-{next(self._ids)}", data, dict(attributes or {}),
                          ordering_key or "", timeout, topic)
        self.messages.append(message)
        return message.message_id

    def take(self) -> list[Message]:
        """Return the messages captured so far and forget them."""
        taken, self.messages = self.messages, []
        return taken


def push_body(data: bytes, attributes: Mapping[str, str] | None = None,
              message_id: str = "m-1", subscription: str = "projects/p/subscriptions/s",
              publish_time: str = "") -> dict[str, Any]:
    """Return a wrapped push request body, as Pub/Sub sends it."""
    message: dict[str, Any] = {"data": base64.b64encode(data).decode(), "messageId": message_id,
                               "attributes": dict(attributes or {})}
    if publish_time:
        message["publishTime"] = publish_time
    return {"message": message, "subscription": subscription}


class LocalBus:
    """Runs events and their cascades in-process, synchronously, through the real processor."""

    def __init__(self, router: Router, store: EventStore | None = None, *,
                 settings: Settings | None = None, clock: FakeClock | None = None,
                 database: Any = None, classifier: Classifier | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.settings = settings or Settings(relay_inline=False)
        self.clock = clock or FakeClock()
        self.store: EventStore = store if store is not None else MemoryEventStore(
            lease=dt.timedelta(seconds=self.settings.lease_seconds), database=database,
            clock=self.clock)
        self.publisher = CapturingPublisher()
        self.relay = Relay(self.store, self.publisher, now=self.clock, sleep=lambda _: None,
                           telemetry=telemetry)
        classifier = classifier or Classifier()
        self.partners = Partners.beside(self.store, self.settings, now=self.clock,
                                        classifier=classifier, sleep=self.clock.sleep,
                                        monotonic=self.clock.monotonic)
        """The partners ``context.partner`` calls through; ``partners.store`` their store."""
        self.processor = Processor(self.store, router, self.settings, self.clock,
                                   after_success=self.relay, classifier=classifier,
                                   sleep=self.clock.sleep, monotonic=self.clock.monotonic,
                                   middleware=telemetry.middleware() if telemetry else (),
                                   partners=self.partners)
        self.results: list[Result] = []
        """Every delivery's result, in the order they ran."""
        self.messages: dict[str, Message] = {}
        """The last message seen under each idempotency key, for ``redeliver``."""
        self.forwarded: dict[str, list[Message]] = {}
        """What went to each public topic (``Router.forward``), in order; never delivered."""

    def publish(self, event_type: str, data: Mapping[str, Any], *, entity: Entity,
                idempotency_key: str | None = None, ordering_key: str | None = None,
                version: str = "v1", direction: str = "IN") -> str:
        """Publish like ``eventbus.publish``, then run it and its cascade.

        Return the key its record is stored under (``eventbus.model.keys.record_key``).
        """
        event = build_event(event_type, data, entity=entity, version=version,
                            direction=direction)
        body, attributes = build_message(event, key=idempotency_key, ordering_key=ordering_key)
        self.publisher.publish_message(body, attributes, ordering_key=ordering_key)
        self.drain()
        return record_key(event, attributes)

    def publish_raw(self, data: bytes, attributes: Mapping[str, str] | None = None) -> Result:
        """Deliver ``data`` as it is (an invalid payload, say); return its result."""
        self.publisher.publish_message(data, attributes or {})
        return self.drain()[0]

    def redeliver(self, key: str) -> Result:
        """Deliver the last message seen under ``key`` again (as Pub/Sub would on a nack)."""
        self.publisher.messages.append(self.messages[key])
        return self.drain()[0]

    def drain(self) -> list[Result]:
        """Deliver every captured message, and what they emit, until none is left."""
        queue = collections.deque(self._bus_messages())
        ran: list[Result] = []
        while queue:
            ran.append(self._deliver(queue.popleft()))
            queue.extend(self._bus_messages())
        self.results.extend(ran)
        return ran

    def _bus_messages(self) -> list[Message]:
        """What was published to the bus; what went to a public topic is kept aside."""
        bus = []
        for message in self.publisher.take():
            if message.topic is None:
                bus.append(message)
            else:
                self.forwarded.setdefault(message.topic, []).append(message)
        return bus

    def _deliver(self, message: Message) -> Result:
        result = self.processor.process(self._delivery(message))
        if result.key:
            self.messages[result.key] = message
        return result

    def _delivery(self, message: Message) -> Delivery:
        return Delivery(data=message.data, attributes=message.attributes,
                        message_id=message.message_id, publish_time=self.clock().isoformat(),
                        ordering_key=message.ordering_key, form="local")

    def close(self) -> None:
        """End the processor's event loop (started by the first ``async def`` handler)."""
        self.processor.close(grace=0)

    def __enter__(self) -> LocalBus:
        """``with LocalBus(routes) as bus:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the bus."""
        self.close()

    def record(self, key: str) -> Record | None:
        """Return the stored record of ``key``."""
        return self.store.get(key)

    def cascade(self, key: str) -> str:
        """Return the cascade of ``key`` as ``eventbus trace`` prints it."""
        tree = cascade.load(self.store, key)
        return "" if tree is None else cascade.render(tree, marked=key)

    def entity_data(self, key: str) -> Any:
        """Return the stored ``entity_data`` of ``key`` (a convenience for assertions)."""
        record = self.record(key) or {}
        return json.loads(json.dumps(record.get("entity_data")))
