"""Replay mode: the same pipeline over stored SUCCESS records, for ``eventbus rebuild``.

``ReplayProcessor`` is the ``Processor`` in ``ReplayMode``: the steps a mode
may replace (``eventbus.processor.mode.Mode``), some replaced. The claim
leases SUCCESS records (``rebuild_claim_many``: never their status, never one
this rebuild already ran), the heartbeat renews those leases, the finish
appends one audit entry per record (``rebuild_finish_many``). Every other
stage is the live one: locate, the entity holds and lanes of
ordered handlers, the handler under ``concurrency`` threads, the relay.
What differs for the handler (``eventbus.model.rebuild_policy``):

* ``context.replay`` is set; ``context.guard`` is a ``ReplayGuard`` (stored
  results, no call made twice); ``context.partner(...).call`` is refused
  unless the rebuild allows new calls;
* a route with ``replay="skip"`` is never run (``skipped``);
* ordered events run in position order under their entity's hold and never
  move the entity's position; one older than the entity's applied position runs
  only when its lane (the same batch, under the same hold) re-runs the applied
  event after it, so the entity ends on its applied event's state again; else
  it is **stale**: not run, an audit entry ``outcome: stale`` (``ReplayMode.stale``);
* children: an emitted key already in the parent's outbox, or already a
  record, is a duplicate; the others are **new**, listed in the audit entry
  and the result, and appended to the outbox (so published) only with
  ``emit_new``; forwards are published again only with ``forward``;
* a handler that raises leaves the record SUCCESS as it was; the audit entry
  says ``failed`` with the error, and the result is REJECTED with the reason.

An event with **no stored record** (read back from an archive, its record
expired or never made here: ``rebuild(pairs)`` with the record None) has no
lease to take: it goes through the live claim (``claim_many``: a new record,
PENDING under a claim lease, renewed as live) and the live finish, SUCCESS
with its audit entry (``source: archive``, ``new_record: true``) as the
record's first ``replays`` entry, and its children and forwards as above
(new, so kept only with ``emit_new``/``forward``). It has no first result
for a guarded call unless the guard's own record outlived it, so such calls
are refused without ``new_calls``; a refused or failed run stores the record
FAILED for good with the same audit entry, so nothing runs it by itself
later (``eventbus replay KEY`` runs it live, partner calls included).

Such a record carries ``rebuild_made`` (the rebuild's id) from its claim on.
While it is unfinished (its entity stayed busy for the whole rebuild: PENDING;
the rebuild died after its claim: PROCESSING) the store's redrive leaves it
out, since the live pipeline would run it with the live guard and repeat a
call made in production; a rebuild that meets it again (``--resume``, or
``--keys`` naming it) claims it again as a new record, through the live claim
(fenced on the store's clock: taken once the dead claim's lease lapsed).
``eventbus status`` lists every unfinished one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from eventbus.guard import ReplayGuard
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.errors import Classification
from eventbus.model.forward import is_forward
from eventbus.model.order import PositionKindMismatch
from eventbus.model.outcome import Outcome
from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.model.status import Status
from eventbus.partners import Partners
from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.mode import LiveMode
from eventbus.processor.ordering import Lane, stale_pending
from eventbus.processor.pipeline import Clock, Processor
from eventbus.processor.rejections import brief
from eventbus.processor.work import Item, Pending, Result
from eventbus.rebuild import documents as rebuilds
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import (
    BatchClaim,
    EntityRelease,
    Finish,
    Finished,
    ParkedEvents,
    ProcessorStore,
    RebuildStore,
    Record,
)

ARCHIVE_FORM = "archive"
"""``Delivery.form`` of a message read back from an archive (``eventbus.rebuild.archive.FORM``;
named here because the processor never imports the operator tools)."""


class ReplayStore(ProcessorStore, RebuildStore, ParkedEvents, Protocol):
    """What the processor uses in replay mode: its own primitives and the rebuild's."""


class _RebuildLeases:
    """The heartbeat's store in replay mode: ``renew_many`` renews rebuild leases."""

    def __init__(self, store: ReplayStore) -> None:
        self._store = store
        self.fresh = set()

    @property
    def lease(self) -> timedelta:
        """The claim's lease length."""
        return self._store.lease

    fresh: set[str]
    """Keys claimed as new records (no stored record): their leases are claims."""

    def renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Renew rebuild leases, and the live claims of new records."""
        claims = {key: owner for key, owner in owners.items() if key in self.fresh}
        leases = {key: owner for key, owner in owners.items() if key not in self.fresh}
        held = self._store.rebuild_renew_many(leases, now) if leases else set()
        return held | (self._store.renew_many(claims, now) if claims else set())

    def renew_entities(self, holders: Mapping[str, str], now: datetime) -> set[str]:
        """Renew entity holds, as live."""
        return self._store.renew_entities(holders, now)

    def guard_renew(self, key: str, owner: str, lease: timedelta) -> bool:
        """Renew a guard's lease, as live."""
        return self._store.guard_renew(key, owner, lease)


@dataclasses.dataclass
class _Rerun(Pending):
    """A replay's outcome before its children are checked against the stored records."""

    entry: dict[str, Any] = dataclasses.field(default_factory=dict)
    candidates: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)
    """Emitted children whose keys the parent's outbox does not list (new, or records)."""
    relayed: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)


class ReplayProcessor(Processor):
    """The pipeline in replay mode (module docstring): a ``Processor`` whose mode is a
    ``ReplayMode``; ``rebuild(pairs)`` runs one batch."""

    mode: ReplayMode

    def __init__(self, store: ReplayStore, router: Router, settings: Settings, now: Clock,
                 replay: Replay, **options: Any) -> None:
        leases = _RebuildLeases(store)
        if options.get("partners") is None:  # a handler's calls go through the service's own
            options["partners"] = Partners.beside(
                store, settings, now=now, classifier=options.get("classifier"),
                sleep=options.get("sleep", time.sleep),
                monotonic=options.get("monotonic", time.monotonic))
        super().__init__(store, router, settings, now, heartbeat=Heartbeat(leases, now=now),
                         mode=lambda processor: ReplayMode(processor, store, replay,
                                                           leases.fresh), **options)
        self.rebuilds, self.replay = store, replay
        self.guard = ReplayGuard(store, lease=store.lease, now=now,
                                 keep=self.heartbeat.guarding, new_calls=replay.new_calls,
                                 sleep=self.guard.sleep, monotonic=self.guard.monotonic)
        if not replay.new_calls and self.partners is not None:
            self.partners.refused = "a rebuild makes it only with --allow-new-calls"

    def rebuild(self, pairs: Sequence[tuple[Delivery, Record | None]]) -> list[Result]:
        """Run each delivery again in replay mode; one ``Result`` each.

        A pair's record is the stored record as read (leased for the rebuild), or
        None when there is none: a new record through the live claim (module docstring).
        """
        mode = self.mode
        mode.records = {id(delivery): record for delivery, record in pairs}
        try:
            return self.run([delivery for delivery, _ in pairs])
        finally:
            mode.records, mode.asked_new = {}, set()
            mode.fresh.clear()


class ReplayMode(LiveMode):
    """The replay forms of the pipeline's steps (module docstring); every other step is live.

    It replaces only steps ``Mode`` declares (``tests/unit/test_modes.py``): the claim
    leases SUCCESS records, the attempts are never counted, an older event whose lane
    does not re-run the applied one is stale, the context is a replay's, a success
    and a failure make audit entries, and the finish appends them.
    """

    moves_position = False
    honours_max_age = False

    def __init__(self, processor: Processor, rebuilds: ReplayStore, replay: Replay,
                 fresh: set[str]) -> None:
        super().__init__(processor)
        self.rebuilds, self.replay = rebuilds, replay
        self.fresh = fresh
        """The keys of this batch claimed as new records (shared with the heartbeat)."""
        self.records: dict[int, Record | None] = {}
        """The batch's pairs, a delivery's stored record by ``id(delivery)`` (``rebuild``)."""
        self.asked_new: set[str] = set()
        """The batch's keys asked of the live claim (no stored record, or an unfinished one)."""

    def claim_batch(self, wanted: list[Item]) -> BatchClaim:
        """Lease the stored SUCCESS records (``rebuild_claim_many``); a new record where
        there is none, through the live claim; a ``replay="skip"`` route, or an event that
        lands on another key now, is decided here (skipped)."""
        asked: dict[str, Record] = {}
        new: dict[str, Mapping[str, Any]] = {}
        for item in wanted:
            record = self.records.get(id(item.delivery))
            assert item.located is not None and item.located.route is not None
            if item.located.route.replay == "skip":
                item.result = _skipped(item, 'its route says replay="skip"')
            elif (record is None and id(item.delivery) in self.records) or (
                    rebuilds.made_unfinished(record) and record is not None
                    and record.get("idempotency_key") == item.key):
                # No record, or one a rebuild made and never finished: a new record,
                # marked with this rebuild (``rebuild_made``) so no redrive runs it.
                new[item.key] = {**item.located.fields, rebuilds.MADE: self.replay.rebuild_id}
            elif record is None or record.get("idempotency_key") != item.key:
                item.result = _skipped(item, "the stored event lands on another key now")
            else:
                asked[item.key] = record
        taken = [item for item in wanted if item.result is None]
        now = self.processor.now
        batch = self.rebuilds.rebuild_claim_many(asked, self.replay.rebuild_id, now()) \
            if asked else BatchClaim({}, {})
        if new:  # no stored record: the live claim makes one (PENDING, a claim lease)
            self.asked_new = set(new)
            made = self.processor.store.claim_many(new, now())
            self.fresh.update(made.taken)
            batch = BatchClaim({**batch.taken, **made.taken}, {**batch.records, **made.records},
                               batch.refused | made.refused)
        # Items decided above are not claimed: ``_claim`` reads only what it was given.
        gone = {item.key for item in wanted if item not in taken}
        return BatchClaim(batch.taken, {k: r for k, r in batch.records.items() if k not in gone},
                          batch.refused)

    def not_taken(self, item: Item, record: Mapping[str, Any] | None,
                  refused: bool) -> Result:
        """Skipped (decided by the claim, not SUCCESS, gone, refused content), already
        rebuilt by this rebuild, or in progress under another rebuild's lease or claim."""
        if item.result is not None:
            return item.result
        if refused:
            return _skipped(item, "the store refuses its record's content")
        if item.key in self.asked_new and rebuilds.made_unfinished(record):
            return Result(Outcome.IN_PROGRESS, key=item.key, event_type=item.event_type,
                          error="a rebuild's claim holds its record (until its lease lapses)")
        if item.key in self.asked_new:
            why = "its claim was taken meanwhile" if record is None else \
                f"a record was stored meanwhile ({record.get('event_status')})"
            return _skipped(item, f"{why}: rebuild it from the store")
        if record is None:
            return _skipped(item, "no such record any more")
        if rebuilds.rebuilt_by(record, self.replay.rebuild_id):
            return Result(Outcome.DUPLICATE, key=item.key, event_type=item.event_type,
                          detail={"skipped": "already rebuilt by this rebuild"})
        if record.get("event_status") == Status.SUCCESS and not record.get("stale") and \
                isinstance(record.get(rebuilds.LEASE), Mapping):
            return Result(Outcome.IN_PROGRESS, key=item.key, event_type=item.event_type,
                          error="another rebuild holds it")
        status = "stale (never ran)" if record.get("stale") else record.get("event_status")
        return _skipped(item, f"it is {status}, not SUCCESS")

    def attempts_used(self, item: Item) -> int:
        """Zero: a rebuild spends no attempt of the event's, so no cap refuses it."""
        return 0

    def undecided(self, item: Item, lane: Lane) -> None:
        """The entity's applied event failed for a passing reason (transient: the store
        away, a partner down): not decided, but given back untouched (``UNAVAILABLE``:
        the rebuild runs it again, then ``--resume``), so the entity is not left on the
        state of an older event its lane re-ran before it (issue 39); a failed audit
        entry would keep every run of this rebuild from running it again."""
        pending = item.pending
        if not lane.entity_key or not isinstance(pending, _Rerun) or \
                pending.entry.get("outcome") != "failed" or not _is_applied(item, lane):
            return
        error = pending.entry.get("error") or {}
        if error.get("classification") != Classification.TRANSIENT.value:
            return
        item.pending = Pending(
            Finish(item.key, pending.finish.owner, unclaim=True),
            Result(Outcome.UNAVAILABLE, key=item.key, event_type=item.event_type,
                   attempt=pending.result.attempt,
                   error=f"the entity's applied event failed for now: {pending.result.error}"))

    def stale(self, item: Item, lane: Lane) -> Pending | None:
        """An older event whose re-run would leave its entity behind: not run, audited.

        One whose position is of another kind than the entity's cannot be ordered
        at all: not run either, audited as failed with the reason (a new record:
        stored FAILED for good, as live)."""
        why = lane.mismatched(item)
        if why is not None:
            return self.failure(item, PositionKindMismatch(why))
        if not _rewinds(item, lane):
            return None
        assert item.claim is not None
        stale = dict((stale_pending(item, lane).finish.extra or {})["stale"])
        entry = {**self._audit(item), "outcome": "stale", "attempt": item.claim.attempt,
                 "stale": stale}
        why = (f"stale: position {stale['position']!r} is older than the entity's applied "
               f"{lane.position!r}, which this rebuild does not re-run after it")
        result = Result(Outcome.DUPLICATE, key=item.key, event_type=item.event_type,
                        attempt=item.claim.attempt, detail={"skipped": why, "stale": stale})
        # A new record (from an archive) is stored stale, as a live stale event is.
        extra = {"stale": stale} if item.key in self.fresh else None
        return _Rerun(Finish(item.key, item.claim.owner, extra=extra), result, entry=entry)

    def context(self, item: Item) -> Context:
        """The live context, with ``replay`` set (the guard is the processor's ``ReplayGuard``)."""
        context = super().context(item)
        context.replay = self.replay
        return context

    def success(self, item: Item, context: Context, carried: Mapping[str, str] | None,
                extra: Mapping[str, Any] | None = None) -> Pending:
        """Rebuilt: an audit entry counting the children already in the outbox (duplicates,
        changed) and the forwards published again; the others wait for ``store_finishes``."""
        assert item.claim is not None
        stored = [dict(entry) for entry in item.claim.record.get("outbox") or []]
        known = {str(entry.get("idempotency_key")): entry for entry in stored}
        created = documents.bson_time(self.processor.now())
        duplicates, changed, candidates = 0, [], []
        for child in context.children:
            document: Mapping[str, Any] = child.to_document(item.key, context.root_key, created)
            found = known.get(child.key)
            if found is None:
                candidates.append(document)
                continue
            duplicates += 1
            if found.get("payload_fingerprint") not in (child.fingerprint, None):
                changed.append(child.key)
        relayed: list[Mapping[str, Any]] = list(stored)
        forwarded: list[str] = []
        if self.replay.forward:
            fresh = self.processor.router.forwards.entries(context.event, item.key,
                                                           context.root_key, created)
            for forward in fresh:
                at = next((i for i, old in enumerate(stored)
                           if old.get("idempotency_key") == forward["idempotency_key"]), None)
                if at is not None:
                    relayed[at] = forward  # published again; the stored entry stays as it is
                else:
                    candidates.append(forward)
                forwarded.append(str(forward["idempotency_key"]))
        entry = {**self._audit(item), "outcome": "rebuilt", "attempt": item.claim.attempt,
                 "children": {"duplicates": duplicates, "changed": changed},
                 "forwarded": forwarded}
        result = Result(Outcome.PROCESSED, key=item.key, event_type=item.event_type,
                        attempt=item.claim.attempt, children=len(context.children))
        # A new record gets the order fields a live SUCCESS stores (never the entity's).
        return _Rerun(Finish(item.key, item.claim.owner,
                             extra=extra if item.key in self.fresh else None), result,
                      entry=entry, candidates=candidates, relayed=relayed)

    def _audit(self, item: Item) -> dict[str, Any]:
        """The rebuild's audit fields, and where the event came from when not the store."""
        entry = self.replay.audit()
        if item.delivery.form == ARCHIVE_FORM:
            entry["source"] = "archive"
            entry["message_id"] = item.delivery.message_id
        if item.key in self.fresh:
            entry["new_record"] = True
        return entry

    def failure(self, item: Item, exc: Exception) -> Pending:
        """Failed: an audit entry with the error, the record left as it was; REJECTED."""
        assert item.claim is not None
        error = documents.error_document(exc, self.processor.classifier.classify(exc).value)
        entry = {**self._audit(item), "outcome": "failed", "attempt": item.claim.attempt,
                 "error": error}
        result = Result(Outcome.REJECTED, key=item.key, event_type=item.event_type,
                        attempt=item.claim.attempt, error=brief(exc),
                        detail={"failed": str(error.get("message", ""))})
        return _Rerun(Finish(item.key, item.claim.owner), result, entry=entry)

    def store_finishes(self, waiting: list[Item], releases: list[EntityRelease]) -> Finished:
        """``rebuild_finish_many`` of the audit entries (the children not yet records new),
        and ``finish_many`` of new records' live finishes and the entities' releases."""
        reruns = [item.pending for item in waiting if isinstance(item.pending, _Rerun)]
        asked = [str(c["idempotency_key"]) for rerun in reruns for c in rerun.candidates]
        # One read for the whole batch, and only when some child is not in its outbox.
        existing = {str(r.get("idempotency_key")) for r in self.processor.store.get_many(asked)} \
            if asked else set()
        finishes, claims = [], []
        for item in waiting:
            pending = item.pending
            assert pending is not None
            if isinstance(pending, _Rerun):
                finish = self._settled(pending, existing)
            else:  # its entity was busy: the lease goes back untouched
                finish = dataclasses.replace(pending.finish, unclaim=True)
            if item.key in self.fresh:
                claims.append(_live(finish, pending))
            else:
                finishes.append(finish)
        done = self.rebuilds.rebuild_finish_many(finishes, self.processor.now()) if finishes \
            else Finished()
        if claims or releases:
            # New records' live finishes, and the entities' holds (a rebuild never
            # moves an entity's position: its releases carry none), in one round trip.
            live = self.processor.store.finish_many(claims, self.processor.now(), releases)
            done = Finished(done.lost | live.lost, done.refused | live.refused,
                            done.unreleased | live.unreleased)
        return done

    def _settled(self, rerun: _Rerun, existing: set[str]) -> Finish:
        new = [c for c in rerun.candidates if str(c["idempotency_key"]) not in existing]
        if rerun.entry.get("outcome") == "rebuilt":
            children = rerun.entry["children"]
            children["duplicates"] += len(rerun.candidates) - len(new)
            children["new"] = [{"key": c["idempotency_key"], "event_type": c.get("event_type")}
                               for c in new]
            children["emitted"] = bool(new) and self.replay.emit_new
            rerun.result.detail = {"new_children": [str(c["idempotency_key"]) for c in new],
                                   "emitted": children["emitted"],
                                   "duplicates": children["duplicates"],
                                   "changed": children["changed"],
                                   "forwarded": rerun.entry["forwarded"]}
        append = tuple(new) if self.replay.emit_new else tuple(
            c for c in new if is_forward(c) and self.replay.forward)
        rerun.relayed.extend(append)
        return dataclasses.replace(rerun.finish, outbox=append, audit=rerun.entry)

    def relayed(self, item: Item) -> Sequence[Mapping[str, Any]]:
        """The outbox entries the rebuild publishes again (none when none is PENDING)."""
        pending = item.pending
        return pending.relayed if isinstance(pending, _Rerun) and any(
            entry.get("status") == Status.PENDING for entry in pending.relayed) else ()


def _live(finish: Finish, pending: Pending) -> Finish:
    """The live finish of a new record: SUCCESS (or FAILED for good) with its audit entry."""
    if finish.unclaim or finish.audit is None:
        return finish
    audit = {"replays": [dict(finish.audit)]}
    if isinstance(pending, _Rerun) and pending.entry.get("outcome") == "failed":
        error = pending.entry.get("error") or {}
        return Finish(finish.key, finish.owner, error=error, retryable=False, extra=audit)
    return Finish(finish.key, finish.owner, outbox=finish.outbox,
                  extra={**dict(finish.extra or {}), **audit})


def _rewinds(item: Item, lane: Lane) -> bool:
    """True when re-running ``item`` would move its entity's state back behind the
    applied position: it is older, and its lane re-runs no applied event after it.

    Replay never moves the stored position, so an older event's handler would
    write an older state under a newer position (issue 39, fault 2). Running
    it is safe only when the applied event runs again after it, in the same
    lane under the same hold, so the lane ends on the applied event's state.
    """
    if not lane.stale(item):
        return False
    later = lane.items[lane.items.index(item) + 1:]
    return not any(_is_applied(other, lane) for other in later)


def _is_applied(item: Item, lane: Lane) -> bool:
    """True when ``item`` is the entity's applied event (its key, or its position when
    the entity names no key)."""
    if lane.applied_key:
        return item.key == lane.applied_key
    order = item.located.order if item.located is not None else None
    return order is not None and order.position == lane.position


def _skipped(item: Item, why: str) -> Result:
    return Result(Outcome.DUPLICATE, key=item.key, event_type=item.event_type,
                  detail={"skipped": why})
