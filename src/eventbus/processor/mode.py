"""The pipeline's replaceable steps, declared: ``Mode``, and ``LiveMode``, what a service runs.

``Processor`` (``eventbus.processor.pipeline``) runs the stages over a batch and
calls its ``mode`` at each point where a mode may decide otherwise: what the
claim takes, what a key not taken answers, how many attempts an event spent,
whether an ordered event runs, what its handler gets, what its success and its
failure store, how the batch's outcomes are stored, and what the relay
publishes. Those steps are ``Mode``'s methods (and its ``moves_position``
flag), and nothing else of the pipeline is replaced: a change outside them is a
change to every mode, a change to a ``LiveMode`` step one to every mode whose
class does not replace it. ``LiveMode`` is the live pipeline's; ``eventbus.rebuild.mode.ReplayMode``
replaces steps of it for ``eventbus rebuild`` (``tests/unit/test_modes.py``
checks that it replaces nothing else).

A mode holds its processor (``processor``) for the machinery it shares: the
store, the clock, the router, the classifier, the lanes, the guard.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from eventbus.correlation import tracecontext
from eventbus.model.content import error_text
from eventbus.model.context import Context
from eventbus.model.errors import (
    Classification,
    ContentRejected,
    Expired,
    PartnerPaused,
    RetryAfter,
    caused_by,
)
from eventbus.model.outcome import Outcome
from eventbus.processor.ordering import Lane, stale_pending
from eventbus.processor.rejections import brief, existing
from eventbus.processor.work import Item, Pending, Result
from eventbus.store import documents
from eventbus.store.base import BatchClaim, EntityRelease, Finish, Finished
from eventbus.store.documents import parked as parking

if TYPE_CHECKING:  # the processor builds its mode with itself: a type here, not an import
    from eventbus.processor.pipeline import Processor
    from eventbus.settings import Settings

logger = logging.getLogger("eventbus")


class Mode(abc.ABC):
    """The steps of the pipeline a mode may replace: exactly these, each an abstract method.

    The batch's stages call ``claim_batch`` and ``not_taken`` (claim),
    ``store_finishes`` (finish) and ``relayed`` (relay) once for the batch,
    whichever path its handlers take. Each handler's run calls ``attempts_used``,
    ``context``, then ``success`` (and reads ``moves_position``) or ``failure``
    then ``undecided``; an ordered lane asks ``stale`` before each of its
    events. **The async path shares every step**: an ``async def`` handler's
    lane on the processor's loop (``Processor._run_lane_async``) asks the same
    ``stale``, and its run (``Processor._run_async``) the same
    ``attempts_used``, ``context``, ``success``, ``failure`` and ``undecided``;
    a sync handler in such a lane runs the sync run in a thread. It differs only
    where it awaits (the hold's confirmation, a slot of the loop, the handler),
    so no step is async and a mode writes each step once for both paths.

    The per-handler steps run on whichever thread runs the handler (the
    caller's, one of a batch's ``concurrency`` threads, the loop's), several
    lanes at once: what a mode decides for one item it keeps on the ``Item``
    (its ``pending``), and what it keeps for the batch it sets before the
    lanes run (in ``claim_batch``) and clears after.
    """

    moves_position: bool
    """True when each ordered SUCCESS moves its entity's applied position (live); False
    when ordered events run in position order under their entity's hold and leave the
    position where it is (a rebuild re-runs old events)."""
    honours_max_age: bool
    """True when a route's ``max_age`` refuses an event too old to run (live); False when
    every chosen event runs whatever its age (a rebuild runs what the operator chose)."""

    @abc.abstractmethod
    def claim_batch(self, wanted: list[Item]) -> BatchClaim:
        """Claim ``wanted`` (routed, undecided, one item per key) in one round trip.

        Decides which keys are taken (their claims, and the entities the claim
        held), the records of the others as read, and the keys whose content the
        store refuses. A mode may decide an item here instead (its ``result``
        set, its key left out of the answer); ``not_taken`` then sees it.
        """

    @abc.abstractmethod
    def not_taken(self, item: Item, record: Mapping[str, Any] | None,
                  refused: bool) -> Result:
        """The answer for an item the claim did not take.

        ``record`` is its stored record as the claim read it (None: none, or taken
        and gone meanwhile), ``refused`` True when the store refuses its content:
        a duplicate, in progress, a conflict (recorded) or refused content.
        """

    @abc.abstractmethod
    def attempts_used(self, item: Item) -> int:
        """How many of its attempts the claimed ``item`` has spent, this one included.

        Above ``Settings.max_attempts`` its handler is not run (the attempt cap:
        ``failure`` of ``AttemptCapReached``); at the cap a retryable failure is final.
        """

    @abc.abstractmethod
    def stale(self, item: Item, lane: Lane) -> Pending | None:
        """For an event of an ordered lane, before it runs: what it stores instead of
        running (the outcome its finish writes), or None to run its handler.

        Live, an event older than its entity's applied position is stored SUCCESS
        as stale, and one whose position is of another kind FAILED for good.
        """

    @abc.abstractmethod
    def context(self, item: Item) -> Context:
        """The ``Context`` the claimed item's handler is called with.

        Called inside the handler's ``try``: an exception here fails the item as
        the handler's own would (``failure``).
        """

    @abc.abstractmethod
    def success(self, item: Item, context: Context, carried: Mapping[str, str] | None,
                extra: Mapping[str, Any] | None = None) -> Pending:
        """What a handler that returned stores and answers: its finish and its result.

        ``context`` is the handler's (its children), ``carried`` the trace attributes
        its children carry (a middleware's), ``extra`` the order fields an ordered
        event's record gets (``ordering.applied_fields``; None when unordered).
        """

    @abc.abstractmethod
    def failure(self, item: Item, exc: Exception) -> Pending:
        """What a handler's exception stores and answers (or the attempt cap's, or a
        position of another kind's): retried, failed for good, or parked."""

    @abc.abstractmethod
    def undecided(self, item: Item, lane: Lane) -> None:
        """After ``failure`` decided a handler run's outcome (``item.pending``), given its
        lane: whether that outcome stands (live: always) or is replaced, e.g. the claim
        given back untouched, for the run to be decided later."""

    @abc.abstractmethod
    def store_finishes(self, waiting: list[Item], releases: list[EntityRelease]) -> Finished:
        """Store the outcomes of ``waiting`` (each has its ``pending``) and the entities'
        releases, in one round trip; answers the leases lost meanwhile, the keys whose
        children the store refused, and the entities whose holds lapsed unreleased."""

    @abc.abstractmethod
    def relayed(self, item: Item) -> Sequence[Mapping[str, Any]]:
        """The outbox the relay stage publishes from for a stored PROCESSED ``item``
        (empty: nothing to publish)."""


STEPS = frozenset(Mode.__abstractmethods__) | {"moves_position", "honours_max_age"}
"""The names of the steps a mode may replace (``Mode``'s abstract methods and its flag)."""


class LiveMode(Mode):
    """The live pipeline's steps: what ``Processor`` does for a service and its workers."""

    moves_position = True
    honours_max_age = True

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        """The processor whose steps these are (its store, clock, router, lanes, guard)."""

    def claim_batch(self, wanted: list[Item]) -> BatchClaim:
        """One ``claim_many`` for ``wanted``, holding ordered handlers' entities in it."""
        processor = self.processor
        # Ordered handlers' entities are held in the claim's own round trips.
        takes = processor.lanes.takes(wanted) if any(
            item.located is not None and item.located.order for item in wanted) else None
        return processor.store.claim_many({item.key: item.located.fields for item in wanted
                                           if item.located is not None}, processor.now(), takes)

    def not_taken(self, item: Item, record: Mapping[str, Any] | None,
                  refused: bool) -> Result:
        """Refused content, in progress (no record), a conflict, or the stored outcome."""
        assert item.located is not None
        rejections = self.processor.rejections
        if refused:
            return rejections.refuse_content(item.located)
        if record is None:  # taken and gone meanwhile: ask again later
            return Result(Outcome.IN_PROGRESS, key=item.key, event_type=item.event_type)
        if documents.conflicts(record, item.located.fingerprint):
            return rejections.conflict(item.located, record)
        return existing(record, item.located)

    def attempts_used(self, item: Item) -> int:
        """The claim's attempt, less those before a replay and those spent parked."""
        # A replay grants a fresh set of attempts: count from where it started;
        # a parked claim never called its partner, so it spends none.
        assert item.claim is not None
        since = item.claim.record.get("replayed_at_attempt", 0)
        since = since if isinstance(since, int) and not isinstance(since, bool) else 0
        return item.claim.attempt - since - parking.parks(item.claim.record)

    def stale(self, item: Item, lane: Lane) -> Pending | None:
        """Stored SUCCESS as stale when older than the applied position, else None."""
        return stale_pending(item, lane) if lane.stale(item) else None

    def context(self, item: Item) -> Context:
        """The live context: the store's database, the processor's clock, guard and partners."""
        located, claim, processor = item.located, item.claim, self.processor
        assert located is not None and located.route is not None and located.event is not None
        assert claim is not None
        log = logging.LoggerAdapter(logger, {"requestId": item.request_id,
                                             "idempotency_key": located.key})
        return Context(event=located.handler_event(), key=located.key,
                       attempt=claim.attempt, delivery=located.delivery, log=log,
                       db=processor.store.database, now=processor.now,
                       root_key=located.root_key, guard=processor.guard,
                       partners=processor.partners)

    def success(self, item: Item, context: Context, carried: Mapping[str, str] | None,
                extra: Mapping[str, Any] | None = None) -> Pending:
        """SUCCESS with the children and forwards in its outbox (trace-stamped): PROCESSED."""
        assert item.claim is not None
        processor = self.processor
        key, created = item.key, documents.bson_time(processor.now())
        outbox: list[dict[str, Any]] = [child.to_document(key, context.root_key, created)
                                        for child in context.children]
        outbox += processor.router.forwards.entries(context.event, key, context.root_key,
                                                    created, item.claim.record.get("outbox", ()))
        outbox = tracecontext.stamp(outbox, carried)
        return Pending(Finish(key, item.claim.owner, outbox=tuple(outbox), extra=extra),
                       Result(Outcome.PROCESSED, key=key, event_type=item.event_type,
                              attempt=item.claim.attempt, children=len(context.children)))

    def failure(self, item: Item, exc: Exception) -> Pending:
        """Parked (a paused partner), FAILED for good (permanent, refused content, the
        attempt cap) or FAILED retryable, due for the redrive."""
        assert item.claim is not None
        paused = _paused(exc)
        if paused is not None:
            return self._parked(item, exc, paused)
        processor = self.processor
        settings = processor.settings
        cap = attempt_cap(item, settings)
        later = caused_by(exc, RetryAfter)
        if later is not None and self.attempts_used(item) < cap:
            return self._deferred(item, exc, later)
        kind = processor.classifier.classify(exc)
        # A write the store refuses for its content (too large, a value it
        # cannot hold), the record's or a handler's own, fails the same way on
        # every retry: FAILED for good with the reason, not 503 until the cap.
        content = isinstance(exc, ContentRejected) or documents.refuses_content(exc)
        final = kind is Classification.PERMANENT or content
        expired = isinstance(exc, Expired)
        final = final or expired
        capped = self.attempts_used(item) >= cap and not final
        label = "attempt_cap" if capped else "expired" if expired else \
            "content" if content else kind.value
        # Due on the store's clock: the redrive compares it with the store's now.
        redrive_at = processor.store.now() + timedelta(seconds=settings.redrive_after_seconds)
        finish = Finish(item.key, item.claim.owner, error=documents.error_document(exc, label),
                        retryable=not (final or capped), redrive_at=redrive_at)
        outcome = Outcome.REJECTED if final or capped else Outcome.RETRY
        level = logging.ERROR if outcome is Outcome.REJECTED else logging.WARNING
        return Pending(finish, Result(outcome, key=item.key, event_type=item.event_type,
                                      attempt=item.claim.attempt, error=brief(exc)),
                       (level, f"{label} on {item.key} attempt {item.claim.attempt}: "
                               f"{error_text(exc)}"))

    def _parked(self, item: Item, exc: Exception, paused: PartnerPaused) -> Pending:
        # The partner was not called: stored FAILED-retryable and acked, so
        # the subscription's success rate (every partner's push rate) holds;
        # the redrive brings it back at ``until``.
        assert item.claim is not None
        error = {**documents.error_document(exc, parking.PARKED),
                 "partner": paused.partner, "until": paused.until,
                 "parks": parking.parks(item.claim.record) + 1}
        finish = Finish(item.key, item.claim.owner, error=error, retryable=True,
                        redrive_at=paused.until, parked=True)
        return Pending(finish, Result(Outcome.PARKED, key=item.key, event_type=item.event_type,
                                      attempt=item.claim.attempt, error=brief(exc)),
                       (logging.INFO, f"parked {item.key} until {paused.until}: "
                                      f"{error_text(exc)}"))

    def _deferred(self, item: Item, exc: Exception, later: RetryAfter) -> Pending:
        # The handler said when: acked and stored retryable at that time on the store's
        # clock (so instances whose clocks differ agree), the attempt spent.
        assert item.claim is not None
        now = self.processor.store.now()
        at = now + timedelta(seconds=later.delay(
            now, self.processor.settings.retry_after_max_seconds))
        error = {**documents.error_document(exc, RetryAfter.classification), "until": at}
        # not_before: a duplicate delivery meanwhile is answered, never run early.
        finish = Finish(item.key, item.claim.owner, error=error, retryable=True, redrive_at=at,
                        not_before=at)
        return Pending(finish, Result(Outcome.DEFERRED, key=item.key, event_type=item.event_type,
                                      attempt=item.claim.attempt, error=brief(exc)),
                       (logging.INFO, f"deferred {item.key} until {at} (attempt "
                                      f"{item.claim.attempt}): {error_text(exc)}"))

    def undecided(self, item: Item, lane: Lane) -> None:
        """Live, a failure's outcome stands."""

    def store_finishes(self, waiting: list[Item], releases: list[EntityRelease]) -> Finished:
        """One ``finish_many`` of the waiting outcomes and the entities' releases."""
        processor = self.processor
        return processor.store.finish_many([item.pending.finish for item in waiting
                                            if item.pending is not None], processor.now(),
                                           releases)

    def relayed(self, item: Item) -> Sequence[Mapping[str, Any]]:
        """The outbox of the item's finish."""
        return item.pending.finish.outbox if item.pending is not None else ()


def attempt_cap(item: Item, settings: Settings) -> int:
    """The attempt cap of ``item``'s route (``Route.max_attempts``), else the settings'."""
    route = item.located.route if item.located is not None else None
    return (route.max_attempts if route is not None else None) or settings.max_attempts


def _paused(exc: BaseException) -> PartnerPaused | None:
    """The ``PartnerPaused`` that ``exc`` is or was raised ``from`` (a handler may wrap it)."""
    return caused_by(exc, PartnerPaused)
