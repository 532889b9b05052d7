"""Store-driven redrive: the store, not the broker's retention, finishes every retry.

Pub/Sub retries for days, but its retention ends (7 days by default), a
dead-lettered message needs a subscription to survive, and the local emulator
sometimes stops redelivering. So each retryable failure is stored with a
``redrive_at`` (twice the subscription's maximum backoff by default); a record
still FAILED-retryable then, or PROCESSING under a lease that expired long ago
(its worker died and nothing came back), is published again with its original
key and attributes, so the normal push path claims and runs it. Each redrive
is counted and the next one backs off (doubling, capped); after
``EVENTBUS_REDRIVE_MAX`` redrives the event is given up for good, and the
attempt cap applies as always. Republishing is at least once: the claim
deduplicates a message that comes twice. Parked events come back as their
partner's breaker lets them (``eventbus.partners.parked``): all of a closed
one's, one probe of an open one's whose time has come, none otherwise.

The message is rebuilt from the record as a replay rebuilds it
(``eventbus.workers.original``); ``eventbus redrive`` runs the sweeps
(``eventbus.workers.sweeper``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import PublishError
from eventbus.model.status import Status
from eventbus.partners.parked import Gate
from eventbus.partners.store import PartnerStore, store_beside
from eventbus.processor import Located
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings
from eventbus.store.base import RedriveStore
from eventbus.store.documents.parked import parks
from eventbus.workers.original import NotReplayable, build

logger = logging.getLogger("eventbus.redrive")


@dataclasses.dataclass
class RedriveReport:
    """What one sweep did, counted in records."""

    republished: int = 0
    abandoned: int = 0
    """Given up for good after the redrive cap."""
    failed: int = 0
    """Not published (Pub/Sub down, or a message this sweeper cannot rebuild): the record
    stays due and the next sweep tries again."""
    skipped: int = 0
    """Another sweeper (or a delivery) changed the record first."""
    waiting: int = 0
    """Parked for a partner whose breaker does not let them through yet (``workers.parked``)."""

    def __str__(self) -> str:
        return (f"republished {self.republished}, abandoned {self.abandoned}, "
                f"failed {self.failed}, skipped {self.skipped}, waiting {self.waiting}")


def _why(record: Mapping[str, Any], redrives: int) -> str:
    """The error a record given up after the redrive cap carries, saying what it was waiting for."""
    if record.get("event_status") == Status.PROCESSING:
        return (f"given up after {redrives} redrives: left PROCESSING by a worker that never "
                "finished, and no redriven copy was processed")
    return f"given up after {redrives} redrives"


class Redriver:
    """Publishes again the records the broker left behind; one ``sweep()`` is one pass."""

    def __init__(self, store: RedriveStore, publisher: MessagePublisher, settings: Settings, *,
                 now: Callable[[], datetime], locate: Callable[[Delivery], Located],
                 partners: PartnerStore | None = None) -> None:
        self.store, self.publisher, self.settings = store, publisher, settings
        self.now, self.locate = now, locate
        self.partners = partners or store_beside(store, settings)
        """The breakers a parked event waits for (the partners' store beside ``store``)."""
        self._gate = Gate(self.partners, settings, now())

    def sweep(self, limit: int = 500) -> RedriveReport:
        """Redrive or give up every record that is due, at most ``limit`` of them.

        Records this pass could not act on (not published, or changed by
        someone else) stay due; the pass reads past them, page by page, so
        however many there are they never starve the others.
        """
        # The store's clock: what is due, and when the next redrive is, are its to say.
        now = self.store.now()
        report, seen = RedriveReport(), set[str]()
        self._gate = Gate(self.partners, self.settings, now)
        while report.republished + report.abandoned < limit:
            page = self.store.redrivable(limit - report.republished - report.abandoned, seen)
            if not page:
                break
            for record in page:
                seen.add(str(record["idempotency_key"]))
                self._redrive(record, now, report)
        logger.info("redrive pass: %s", report)
        return report

    def _redrive(self, record: Mapping[str, Any], now: datetime, report: RedriveReport) -> None:
        if not self._gate.lets_through(record):
            report.waiting += 1  # stays due, unchanged: its partner is still paused
            return
        key, redrives = str(record["idempotency_key"]), int(record.get("redrives") or 0)
        # A redrive that ended parked found the partner paused: it spends nothing.
        spent = max(0, redrives - parks(record))
        if spent >= self.settings.redrive_max:
            self._abandon(key, now, "redrive_cap", _why(record, redrives), report)
            return
        try:
            message = build(record, self.locate)
        except NotReplayable as exc:
            # Most likely the sweeper runs without the service's router
            # (EVENTBUS_APP): never give an event up for our own misconfiguration.
            logger.error("redrive of %s not possible here: %s", key, exc)
            report.failed += 1
            return
        # Counted before the publish, not after: the republished message may be processed
        # (SUCCESS) before a later mark could match, and a mark first is also the fence that
        # lets one sweeper of several publish it. A failed publish leaves the record due
        # again after the backoff, so nothing is lost.
        if not self.store.mark_redriven(key, redrives, now + self._backoff(spent)):
            report.skipped += 1
            return
        try:
            self.publisher.publish_message(message.data, message.attributes,
                                           ordering_key=message.ordering_key)
        except PublishError as exc:
            logger.warning("redrive of %s not published (due again after the backoff): %s",
                           key, exc)
            report.failed += 1
            return
        report.republished += 1
        logger.info("redrove %s (redrive %d)", key, redrives + 1)

    def _backoff(self, redrives: int) -> timedelta:
        after = self.settings.redrive_after_seconds * 2 ** min(redrives, 30)
        return timedelta(seconds=min(after, self.settings.redrive_backoff_cap_seconds))

    def _abandon(self, key: str, now: datetime, kind: str, why: str,
                 report: RedriveReport) -> None:
        error = {"type": "RedriveGivenUp", "message": why, "classification": kind}
        if self.store.abandon(key, now, error):
            logger.error("gave up %s for good: %s", key, why)
            report.abandoned += 1
        else:
            report.skipped += 1
