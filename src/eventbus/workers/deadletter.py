"""``eventbus dlq drain``: read the dead-letter subscription into the store, then ack.

A message reaches the dead-letter topic when the broker gave up on it
(``maxDeliveryAttempts``). Nobody reads that topic by itself, so the drain
pulls its subscription and, for each message, finds the key the message
belongs to (``Intake.locate``: the same key its record has), then

* stores it as a FAILED record (for good) marked ``dead_lettered: {at,
  subscription, messageId}`` when the key has no record, or
* marks the record the key already has (its status is left alone).

A message is acked only after its store write succeeded; when the store is
down, the drain stops and the unacked messages come back after their ack
deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from eventbus.model.delivery import Delivery
from eventbus.model.errors import StoreUnavailable
from eventbus.processor import Located
from eventbus.store import documents


@dataclasses.dataclass(frozen=True)
class Pulled:
    """One pulled message: its ack id and the delivery it carries."""

    ack_id: str
    delivery: Delivery


class DeadLetters(Protocol):
    """A pull subscription: what the drain needs of it (tests pass a fake)."""

    subscription: str

    def pull(self, max_messages: int) -> Sequence[Pulled]:
        """Return up to ``max_messages`` messages; empty when there are none now."""
        ...

    def ack(self, ack_ids: Sequence[str]) -> None:
        """Acknowledge the messages with these ack ids."""
        ...


@dataclasses.dataclass
class DrainReport:
    """How many messages were pulled, stored as new records, marked on existing ones, acked."""

    pulled: int = 0
    stored: int = 0
    marked: int = 0
    acked: int = 0
    keys: list[str] = dataclasses.field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the report as plain data."""
        return dataclasses.asdict(self)


def dead_letter_error(delivery: Delivery, located: Located) -> dict[str, Any]:
    """Return the ``error`` of a new dead-lettered record: why the broker gave up, or invalid."""
    if located.error is not None:
        return documents.error_document(located.error, "invalid")
    attempts = f" after {delivery.delivery_attempt} deliveries" if delivery.delivery_attempt \
        else ""
    return {"type": "DeadLettered", "classification": "attempt_cap",
            "message": f"Pub/Sub dead-lettered the message{attempts}"}


def store_one(store: Any, pulled: Pulled, locate: Callable[[Delivery], Located],
              now: datetime) -> tuple[str, str]:
    """Store or mark one dead-lettered message; return ``stored`` or ``marked``, and its key."""
    delivery = pulled.delivery
    located = locate(delivery)
    mark = {"at": now, "subscription": delivery.subscription, "messageId": delivery.message_id}
    raw = delivery.data.decode("utf-8", "replace") if located.error is not None else None
    outcome: str = store.store_dead_letter(located.key, located.fields, now,
                                           dead_letter_error(delivery, located), mark,
                                           raw_payload=raw)
    return outcome, located.key


def drain(store: Any, source: DeadLetters, locate: Callable[[Delivery], Located],
          now: Callable[[], datetime], *, batch: int = 10, limit: int | None = None,
          progress: Callable[[DrainReport], None] | None = None) -> DrainReport:
    """Pull and store until the subscription is empty (or ``limit`` messages); ack each batch."""
    report = DrainReport()
    while limit is None or report.pulled < limit:
        wanted = batch if limit is None else min(batch, limit - report.pulled)
        messages = source.pull(wanted)
        if not messages:
            break
        report.pulled += len(messages)
        done = _store_batch(store, messages, locate, now, report)
        if done:
            source.ack(done)
            report.acked += len(done)
        if progress is not None:
            progress(report)
        if report.error:
            break
    return report


def _store_batch(store: Any, messages: Sequence[Pulled], locate: Callable[[Delivery], Located],
                 now: Callable[[], datetime], report: DrainReport) -> list[str]:
    done: list[str] = []
    for pulled in messages:
        try:
            outcome, key = store_one(store, pulled, locate, now())
        except StoreUnavailable as exc:
            report.error = f"store unavailable, {len(messages) - len(done)} left unacked: {exc}"
            break
        setattr(report, outcome, getattr(report, outcome) + 1)
        report.keys.append(key)
        done.append(pulled.ack_id)
    return done


class PubSubDeadLetters:
    """The dead-letter pull subscription through google-cloud-pubsub (the emulator when set)."""

    def __init__(self, project: str, subscription: str, *, timeout: float = 10.0,
                 client: Any = None, wait: float | None = None) -> None:
        from google.cloud import pubsub_v1

        self.client = client or pubsub_v1.SubscriberClient()
        self.subscription = self.client.subscription_path(project, subscription)
        self.timeout = timeout
        # How long a pull waits on an empty subscription (it is held until about its
        # deadline): the drain ends on the first empty pull. Default: ``timeout``.
        self.wait = timeout if wait is None else wait

    def pull(self, max_messages: int) -> list[Pulled]:
        """Pull up to ``max_messages``; an empty list when none came within the timeout."""
        from google.api_core import exceptions

        try:
            response = self.client.pull(request={"subscription": self.subscription,
                                                 "max_messages": max_messages},
                                        timeout=self.wait)
        except exceptions.DeadlineExceeded:
            return []
        return [Pulled(received.ack_id, self._delivery(received))
                for received in response.received_messages]

    def _delivery(self, received: Any) -> Delivery:
        message = received.message
        published = message.publish_time
        return Delivery(data=bytes(message.data), attributes=dict(message.attributes),
                        message_id=str(message.message_id),
                        publish_time=published.isoformat() if published else "",
                        subscription=self.subscription,
                        delivery_attempt=received.delivery_attempt or None,
                        ordering_key=str(message.ordering_key or ""), form="pull")

    def ack(self, ack_ids: Sequence[str]) -> None:
        """Acknowledge ``ack_ids``."""
        self.client.acknowledge(request={"subscription": self.subscription,
                                         "ack_ids": list(ack_ids)}, timeout=self.timeout)

    def close(self) -> None:
        """Release the client."""
        self.client.close()
