"""Replay: send a FAILED event through the normal push path again, audited and rate-limited.

One replay is three steps, in this order:

1. **build** the message from the record (``eventbus.workers.original``, as
   the redrive sweeper does): its stored event fields as the body and its
   stored attributes (``pubsub.attributes``: the original key, the cascade
   links) as the attributes, and check that the message lands on the
   record's own key (``Intake.locate``, or the key rules when no app is
   given). A record that cannot be rebuilt is skipped, unchanged.
2. **reopen** the record in one atomic update (``record_replay``): FAILED and
   retryable, ``replayed_at_attempt = attempts`` (the processor counts the
   attempt cap from there, so the replay gets a fresh set of attempts), and
   an audit entry ``{by, at, why, attempt}`` appended to ``replays``. A record
   that is no longer FAILED (a delivery is processing it, or it succeeded
   meanwhile) is skipped: the claim decides, never the operator.
3. **publish** the message through a ``MessagePublisher``. If publishing
   fails, the record stays FAILED and retryable (with the audit entry) and the
   result says so: replaying it again sends it.

``--data FILE`` runs a corrected event under a refused record's own key
(invalid, unknown type or version, conflict), and replaying a ``conflict:``
record applies its payload as stored, the same way: ``eventbus.ops.correct``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from eventbus.model.delivery import Delivery
from eventbus.model.errors import AlreadyExists, EventBusError, InvalidEvent
from eventbus.model.status import Status
from eventbus.ops import correct
from eventbus.processor import Located
from eventbus.pubsub.message import MessagePublisher
from eventbus.store.base import Record
from eventbus.workers.original import Locator, Message, NotReplayable, build, ordering_key
from eventbus.workers.rate import RateLimit

logger = logging.getLogger("eventbus.ops")

Outcome = Literal["replayed", "skipped", "failed", "planned"]
STANDARD = ("event_type", "event_version", "idempotency_key")


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """What became of one record: replayed (with the message id), skipped or failed, and why."""

    key: str
    outcome: Outcome
    detail: str = ""
    message_id: str = ""
    new_key: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the result as plain data."""
        return dataclasses.asdict(self)


def spaced(per_second: float | None, *, sleep: Callable[[float], None] = time.sleep,
           monotonic: Callable[[], float] = time.monotonic) -> RateLimit:
    """At most ``per_second`` replays per second, evenly spaced (None, 0 or less: no limit)."""
    limited = per_second if per_second is not None and per_second > 0 else None
    return RateLimit(limited, sleep=sleep, monotonic=monotonic, burst=1)


@dataclasses.dataclass
class Replayer:
    """Replays records through ``publisher``: rebuild, reopen (audited), publish."""

    store: Any
    publisher: MessagePublisher
    now: Callable[[], datetime]
    by: str
    why: str
    locate: Locator
    limit: RateLimit = dataclasses.field(default_factory=lambda: spaced(None))
    redrive_after: timedelta = timedelta(seconds=60)
    """When a reopened record is due for the store-driven redrive if its message never
    arrives (``EVENTBUS_REDRIVE_AFTER_SECONDS``)."""

    def replay(self, record: Mapping[str, Any]) -> ReplayResult:
        """Replay one record; never raises for anything about the record.

        A ``conflict:`` record applies the conflicting payload as it was
        stored, under its own key (``eventbus.ops.correct``).
        """
        key = str(record.get("idempotency_key"))
        try:
            if key.startswith("conflict:") and correct.refused(record):
                return self.replay_with_data(record, correct.stored_payload(record))
            message = build(record, self.locate, keep_age=False)
        except (NotReplayable, InvalidEvent) as exc:
            return ReplayResult(key, "skipped", str(exc))
        return self._reopen_and_publish(key, message, reopen=True)

    def replay_with_data(self, record: Mapping[str, Any],
                         body: Mapping[str, Any]) -> ReplayResult:
        """Run corrected ``body`` under a refused record's own key (``eventbus.ops.correct``).

        Raises ``NotCorrectable`` for a record that ran (SUCCESS, in progress,
        FAILED by its handler); any other problem is a skipped result.
        """
        key = str(record.get("idempotency_key"))
        try:
            fix = correct.correction(record, body, self.locate)
        except InvalidEvent as exc:
            return ReplayResult(key, "skipped", str(exc))
        message = Message(fix.data, fix.attributes, ordering_key(record), fix.key)
        return self._reopen_and_publish(key, message, reopen=False, data=fix.audit)

    def _reopen_and_publish(self, key: str, message: Message, *, reopen: bool,
                            data: Mapping[str, Any] | None = None) -> ReplayResult:
        self.limit.wait()
        now = self.now()
        entry: dict[str, Any] = {"by": self.by, "at": now, "why": self.why}
        try:
            if not self._audit(key, entry, now, reopen=reopen, data=data):
                return ReplayResult(key, "skipped", "no such record any more")
        except AlreadyExists as exc:
            status = exc.record.get("event_status", "?")
            return ReplayResult(key, "skipped", f"it is {status} now; the claim decides")
        logger.info("replay of %s by %s: %s", key, self.by, self.why,
                    extra={"idempotency_key": key, "operator": self.by, "new_key": message.key})
        return self._publish(key, message)

    def _audit(self, key: str, entry: dict[str, Any], now: datetime, *, reopen: bool,
               data: Mapping[str, Any] | None) -> bool:
        current = self.store.get(key)
        if current is None:
            return False
        entry["attempt"] = current.get("attempts", 0)
        if data:
            entry["data"] = dict(data)
        # On the store's clock, as every redrive decision: the caller's may be off by minutes.
        due = self.store.now() + self.redrive_after if reopen else None
        return self.store.record_replay(key, entry, now, reopen=reopen,
                                        redrive_at=due) is not None

    def _publish(self, key: str, message: Message) -> ReplayResult:
        try:
            message_id = self.publisher.publish_message(message.data, message.attributes,
                                                        ordering_key=message.ordering_key)
        except EventBusError as exc:
            return ReplayResult(key, "failed", f"reopened but not published: {exc}",
                                new_key=message.key)
        return ReplayResult(key, "replayed", "", message_id, message.key)


def replayable(record: Mapping[str, Any]) -> bool:
    """Return True when ``record`` is FAILED (only FAILED records are replayed)."""
    return record.get("event_status") == Status.FAILED


def fetch(store: Any, keys: list[str]) -> tuple[list[Record], list[str]]:
    """Return the records of ``keys`` in that order, and the keys that have none."""
    found = {record["idempotency_key"]: record for record in store.get_many(keys)}
    return [found[key] for key in keys if key in found], [k for k in keys if k not in found]


def routerless(store: Any) -> Locator:
    """Return ``locate`` with no router: an event type no router knows is not a fault here."""
    from eventbus.model.errors import UnknownEventType
    from eventbus.model.keys import fingerprint
    from eventbus.model.router import Router
    from eventbus.processor import Intake
    from eventbus.store import documents

    intake = Intake(store, Router())

    def locate(delivery: Delivery) -> Located:
        located = intake.locate(delivery)
        if isinstance(located.error, UnknownEventType) and located.event is not None:
            fields = documents.event_fields(located.event, delivery,
                                            fingerprint=fingerprint(located.event))
            return dataclasses.replace(located, fields=fields, error=None)
        return located

    return locate
