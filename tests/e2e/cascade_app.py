"""``main:app`` with a fault at each cascade step, for tests/e2e/test_cascade.py.

Run as ``gunicorn tests.e2e.cascade_app:app``. Faults, each once across all
gunicorn workers (a marker file in ``CASCADE_FAULTS`` records that it fired):

- the inline relay's first publish fails (``relay-publish``);
- ``PARTNER_NOTIFY_SENT``'s first attempt fails transiently (by attempt
  number, which the store keeps per event).

The partner's own failures are scripted by the test's partner server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from eventbus import Context, Router, TransientError, create_app
from eventbus.model.errors import PublishError
from eventbus.pubsub.message import MessagePublisher
from eventbus.store.mongo import MongoEventStore
from eventbus.web.app import default_publisher, inline_relay, utcnow
from handlers.notifications import NOTIFY, SENT, PartnerNotifier, on_partner_notify_sent
from handlers.orders import on_order_event, order_v1_to_v2
from handlers.settings import AppSettings, PartnerSettings

FAULTS = Path(os.environ["CASCADE_FAULTS"])  # a directory the test owns


def fires_once(name: str) -> bool:
    """True the first time ``name`` is asked for, in any process sharing ``FAULTS``."""
    try:
        os.close(os.open(FAULTS / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class FailingFirstPublish:
    """Wraps the relay's publisher: the very first publish fails."""

    def __init__(self, inner: MessagePublisher) -> None:
        self.inner = inner

    def publish_message(self, data: bytes, attributes: Mapping[str, str], *,
                        ordering_key: str | None = None, timeout: float | None = None,
                        topic: str | None = None) -> str:
        if fires_once("relay-publish"):
            raise PublishError("injected: the relay's first publish fails")
        return self.inner.publish_message(data, attributes, ordering_key=ordering_key,
                                          timeout=timeout, topic=topic)


def sent_failing_first(context: Context) -> None:
    """``on_partner_notify_sent``, whose first attempt fails transiently."""
    if context.attempt == 1:
        raise TransientError("injected: the first attempt to record the notification fails")
    on_partner_notify_sent(context)


def cascade_router(partners: PartnerSettings) -> Router:
    """The cascade's handlers, with the fault in the last step."""
    router = Router()
    router.handler("OR_MGMT", versions=("v2",), upcasters={"v1": order_v1_to_v2})(on_order_event)
    # Internal steps, as in handlers.notifications: only the relay may send them.
    router.handler(NOTIFY, internal=True)(PartnerNotifier(partners))
    router.handler(SENT, internal=True)(sent_failing_first)
    return router


settings = AppSettings.from_env()
store = MongoEventStore.from_settings(settings.eventbus)
relay = (inline_relay(settings.eventbus, store, utcnow,
                      FailingFirstPublish(default_publisher(settings.eventbus)))
         if settings.eventbus.relay_inline else None)
app = create_app(cascade_router(settings.partners), settings.eventbus, store, after_success=relay)
