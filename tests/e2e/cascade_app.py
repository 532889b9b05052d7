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

from eventbus.app import build_service, create_app, inline_relay, utcnow
from eventbus.config import Settings
from eventbus.context import Context
from eventbus.errors import PublishError, TransientError
from eventbus.event import Event
from eventbus.publisher import EventPublisher
from eventbus.router import Router
from eventbus.store import MongoEventStore
from handlers.notifications import NOTIFY, SENT, on_partner_notify, on_partner_notify_sent
from handlers.orders import on_order_event, order_v1_to_v2

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

    def __init__(self, inner: EventPublisher) -> None:
        self.inner = inner

    def publish_event(self, event: Event, *, key: str | None = None,
                      ordering_key: str | None = None,
                      attributes: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> str:
        if fires_once("relay-publish"):
            raise PublishError("injected: the relay's first publish fails")
        return self.inner.publish_event(event, key=key, ordering_key=ordering_key,
                                        attributes=attributes, timeout=timeout)


def sent_failing_first(context: Context) -> None:
    """``on_partner_notify_sent``, whose first attempt fails transiently."""
    if context.attempt == 1:
        raise TransientError("injected: the first attempt to record the notification fails")
    on_partner_notify_sent(context)


def cascade_router() -> Router:
    """The cascade's handlers, with the fault in the last step."""
    router = Router()
    router.handler("OR_MGMT", versions=("v2",), upcasters={"v1": order_v1_to_v2})(on_order_event)
    router.handler(NOTIFY)(on_partner_notify)
    router.handler(SENT)(sent_failing_first)
    return router


settings = Settings.from_env()
store = MongoEventStore.from_settings(settings)
relay = inline_relay(settings, store, utcnow) if settings.relay_inline else None
if relay is not None:
    relay.publisher = FailingFirstPublish(relay.publisher)
app = create_app(settings, store, service=build_service(settings, store, router=cascade_router(),
                                                        after_success=relay))
