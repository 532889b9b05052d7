"""Test doubles for the cascade: a publisher that captures messages instead of sending them."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from eventbus.errors import PublishError
from eventbus.event import Event
from eventbus.publisher import build_message


@dataclasses.dataclass(frozen=True)
class Message:
    """One captured message, as Pub/Sub would have pushed it."""

    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    timeout: float | None


class CapturingPublisher:
    """An ``EventPublisher`` that builds the real message and keeps it.

    ``failures`` publishes fail first (``PublishError``); ``on_publish`` is
    called before each try, so a test can move a fake clock.
    """

    def __init__(self, failures: int = 0, on_publish: object = None) -> None:
        self.messages: list[Message] = []
        self.tries = 0
        self.failures = failures
        self.on_publish = on_publish
        self._ids = itertools.count(1)

    def publish_event(self, event: Event, *, key: str | None = None,
                      ordering_key: str | None = None,
                      attributes: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> str:
        self.tries += 1
        if callable(self.on_publish):
            self.on_publish()
        if self.failures > 0:
            self.failures -= 1
            raise PublishError("injected publish failure")
        data, attrs = build_message(event, key=key, extra=attributes)
        return self.publish_raw(data, attrs, ordering_key=ordering_key, timeout=timeout)

    def publish_raw(self, data: bytes, attributes: Mapping[str, str] | None = None, *,
                    ordering_key: str | None = None, timeout: float | None = None) -> str:
        message = Message(f"msg-{next(self._ids)}", data, dict(attributes or {}),
                          ordering_key or "", timeout)
        self.messages.append(message)
        return message.message_id

    def take(self) -> list[Message]:
        """Return the messages captured so far and forget them."""
        taken, self.messages = self.messages, []
        return taken
