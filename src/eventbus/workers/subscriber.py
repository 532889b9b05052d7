"""The subscription the worker pulls: checked before pulling, then one StreamingPull stream.

google-cloud-pubsub's public API only: ``SubscriberClient.get_subscription``
(it exists; is exactly-once delivery on?) and ``SubscriberClient.subscribe``
with ``FlowControl``; the stream's callback queues each message in the
worker's ``Inbox``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from google.api_core import exceptions as google_exceptions
from google.cloud import pubsub_v1

from eventbus.settings import SettingsError
from eventbus.workers.pull import Inbox

logger = logging.getLogger("eventbus.worker")
STOP_TIMEOUT = 5.0


@dataclasses.dataclass
class Subscription:
    """An existing subscription and its client."""

    client: Any
    path: str
    exactly_once: bool

    @classmethod
    def open(cls, project: str, name: str) -> Subscription:
        """Check that ``name`` exists in ``project``; ``SettingsError`` (one line) if not."""
        client = pubsub_v1.SubscriberClient()
        path = name if name.startswith("projects/") else client.subscription_path(project, name)
        try:
            found = client.get_subscription(request={"subscription": path}, timeout=10)
        except google_exceptions.NotFound:
            client.close()
            raise SettingsError(f"no subscription {path}: create it (`pubsub-emulator.sh "
                                "start` does locally) or pass --subscription") from None
        except google_exceptions.GoogleAPICallError as exc:
            client.close()
            raise SettingsError(f"cannot read subscription {path}: {exc}") from None
        return cls(client, path, bool(found.enable_exactly_once_delivery))

    @contextlib.contextmanager
    def streaming(self, inbox: Inbox, max_messages: int, max_bytes: int,
                  lease_extension: int = 60) -> Iterator[None]:
        """Pull into ``inbox`` for the duration of the block; then stop pulling and close.

        ``lease_extension`` caps each ack-deadline extension the library asks
        for, so the messages of a killed worker come back within it.
        """
        flow = pubsub_v1.types.FlowControl(max_messages=max_messages, max_bytes=max_bytes,
                                           max_duration_per_lease_extension=lease_extension)
        future = self.client.subscribe(self.path, callback=inbox.put, flow_control=flow)
        try:
            yield
        finally:
            future.cancel()
            with contextlib.suppress(Exception):  # cancelled: its result is the cancellation
                future.result(timeout=STOP_TIMEOUT)
            self.client.close()
