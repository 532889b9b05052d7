"""The parts a service is made of, wired from settings: for the push app and the pull worker alike.

``assemble(router, settings, ...)`` builds the store (``MONGODB_URI``),
telemetry (``eventbus.telemetry.from_settings``), the inline outbox relay on
a lazily built publisher, and the ``Processor`` with telemetry's middleware
around its stages. ``eventbus.web.app.create_app`` puts a Flask app in front
of them; ``eventbus.workers.pull.create_worker`` a pull subscription. Nothing
here imports Flask, so a worker process never loads it.

It builds the features too and hands them in: the processor's ``Partners``
(``eventbus.partners``, over the partners' store beside the event store) and
their gauges to telemetry (``Telemetry.observe``). Deleting a feature starts here.

May import: ``eventbus.processor``, ``eventbus.outbox``, ``eventbus.telemetry``,
``eventbus.pubsub``, ``eventbus.store``, ``eventbus.model``, ``eventbus.settings``,
and the features (``eventbus.partners``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from eventbus import clock
from eventbus.model.errors import Classifier
from eventbus.model.router import Router
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners, gauges
from eventbus.processor import AfterSuccess, Clock, Middleware, Processor
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from eventbus.telemetry import Telemetry
from eventbus.telemetry import from_settings as telemetry_from_settings

utcnow = clock.utcnow
"""The process's wall clock (``eventbus.clock.utcnow``): kept under this name for ``web.app``."""


def default_store(settings: Settings) -> EventStore:
    """Return the MongoDB store of ``settings`` (pymongo is imported only here)."""
    from eventbus.store.mongo import MongoEventStore

    return MongoEventStore.from_settings(settings)


def default_publisher(settings: Settings) -> MessagePublisher:
    """Return a publisher to the settings' topic, built on first use.

    A service without Pub/Sub credentials still starts; its children wait
    in the outbox for the sweeper.
    """
    from eventbus.pubsub.publisher import LazyPublisher, Publisher

    return LazyPublisher(lambda: Publisher.from_settings(settings))


def inline_relay(settings: Settings, store: EventStore, now: Clock,
                 publisher: MessagePublisher | None = None,
                 telemetry: Telemetry | None = None) -> Relay:
    """Return the relay that publishes a parent's children before its push is acked.

    It spends at most ``settings.relay_budget_seconds`` per message, and relays
    up to ``settings.relay_parallel`` parents of a batch at once.
    """
    return Relay(store, publisher or default_publisher(settings), now=now,
                 budget=settings.relay_budget_seconds, telemetry=telemetry,
                 parallel=settings.relay_parallel)


@dataclasses.dataclass(frozen=True)
class Parts:
    """A service's store, processor and telemetry, wired together."""

    store: EventStore
    processor: Processor
    telemetry: Telemetry


def assemble(router: Router, settings: Settings, store: EventStore | None = None, *,
             now: Clock | None = None, publisher: MessagePublisher | None = None,
             after_success: AfterSuccess | None = None, classifier: Classifier | None = None,
             telemetry: Telemetry | None = None, concurrency: int = 1,
             middleware: Sequence[Middleware] = ()) -> Parts:
    """Wire the parts; missing ones come from ``settings``.

    ``after_success`` runs after each SUCCESS with children; when it is not
    given, it is the inline relay on ``publisher``, unless ``settings.relay_inline``
    is off. Telemetry is built before the store, so the store's client is
    instrumented when tracing is on. ``middleware`` wraps the stages after
    telemetry's (the pull worker's batch figures).
    """
    telemetry = telemetry or telemetry_from_settings(settings, now=now)
    store = store if store is not None else default_store(settings)
    # Stamps follow the store's clock too, so every time a record holds is on one clock.
    now = now or store.now
    if after_success is None and settings.relay_inline:
        after_success = inline_relay(settings, store, now, publisher, telemetry)
    classifier = classifier or Classifier()
    partners = Partners.beside(store, settings, now=now, classifier=classifier)
    processor = Processor(store, router, settings, now, after_success=after_success,
                          classifier=classifier,
                          middleware=[*telemetry.middleware(), *middleware],
                          concurrency=concurrency, partners=partners)
    telemetry.watch_outbox(store)
    telemetry.observe(gauges.watching(partners.store))
    return Parts(store, processor, telemetry)
