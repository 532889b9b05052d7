"""Per-entity order for handlers declared with ``ordered_by``: lanes, holds and stale events.

After the claim, the claimed events of ordered handlers are grouped by entity
into **lanes**: one lane per entity, its events in position order (ties by
key), run one after the other while other lanes run in parallel. Each lane's
entity is held in the store for the batch, so no other instance runs an event
of it meanwhile: by the claim itself where it can (``claim_many(takes=)``,
``Lanes.takes``: a new entity, or a free one not ahead of its events, in the
claim's own round trips), else by ``take_entities`` (one round trip more):

* an entity another holder has is waited for up to ``order_wait_seconds``;
  then its events give their claims back untouched (``Finish.unclaim``: no
  attempt spent) and are answered IN_PROGRESS (503, nacked): they come back;
* an event older than the entity's applied position is **stale**: stored
  SUCCESS with ``stale`` (no handler, no children, no forward), acked;
* an event whose position is of another kind than the entity's applied one
  (``eventbus.model.order.mismatch``: a number against a time) cannot be
  ordered: stored FAILED for good with the reason, acked, never run;
* each SUCCESS moves the lane's position; the finish stage stores the
  lane's last position with the entity's release, in the same bulk write
  as the events' outcomes (``EntityRelease``).

A holder whose lease ran out without releasing (a crash between its
SUCCESS and the release) left its keys as the entity's ``orphan``: the
new holder reads their records and applies the newest that succeeded before
comparing, so a crash never lets an older event through. Orphan keys whose
records are not finished yet (their holder may still be writing) stay in the
orphan at this holder's release, for the next one to read again.

Fencing: the hold is renewed with the claims, confirmed with the store before
each of a lane's events, its first too, when a quarter lease passed since it
was last known to hold: for the first event, since the round trip that took
it began (``Lane.confirmed``: the claim's, or the ``take_entities`` round's),
not since the lane started, so a process paused between the claim and its
lane (or behind another lane of its batch) finds out there and gives the rest
of its lane back. A lane that starts at once makes no round trip more. The
release only takes while the hold holds; the position only moves forward.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.order import (
    UNTAGGED,
    Ordering,
    Position,
    PositionKindMismatch,
    comparable,
    mismatch,
)
from eventbus.model.outcome import Outcome
from eventbus.model.status import Status
from eventbus.processor.heartbeat import Lease
from eventbus.processor.rejections import brief
from eventbus.processor.work import Item, Pending, Result
from eventbus.store import documents
from eventbus.store.base import EntityHolds, EntityRelease, EntityTake, Finish, ProcessorStore

_POLL = 0.05
"""Seconds between two takes of a busy entity (``order_wait_seconds`` in all)."""


@dataclasses.dataclass(eq=False)
class Lane:
    """Items run one after the other: one unordered item, or one entity's events in order."""

    items: list[Item]
    entity_key: str = ""
    owner: str = ""
    position: Position | None = None
    """The entity's applied position, moved by each SUCCESS of the lane."""
    applied_key: str = ""
    moved: bool = False
    """True when the lane (or an orphan's roll-forward) moved the applied position."""
    hold: Lease | None = None
    """The heartbeat's lease on the entity's hold (None: an unordered lane)."""
    confirmed: float = 0.0
    """When (this process's monotonic clock) the hold was last known to hold: at first,
    when the round trip that took it began (the store set the hold's lease no earlier)."""
    unsettled: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Orphan keys (→ positions) whose records were not finished when read: kept at release."""

    kind: str = UNTAGGED
    """The kind of the applied position (``eventbus.model.order``; untagged: either)."""

    def stale(self, item: Item) -> bool:
        """True when ``item`` must not run: older than the entity's applied position, or
        of another kind than it (``mismatched``; ``stale_pending`` stores which)."""
        order = _order(item)
        return self.mismatched(item) is not None or (
            self.position is not None and order.position < self.position)

    def mismatched(self, item: Item) -> str | None:
        """Why ``item``'s position cannot be ordered against the applied one, or None."""
        return mismatch(_order(item), self.position, self.kind)

    def applied(self, item: Item) -> None:
        """``item`` succeeded: its position (and its kind) is the entity's now."""
        order = _order(item)
        self.position, self.applied_key, self.moved = order.position, item.key, True
        self.kind = order.kind

    def release(self) -> EntityRelease:
        """What the finish stage stores for the entity: its position, and no holder."""
        orphan = {"keys": list(self.unsettled), "positions": list(self.unsettled.values())} \
            if self.unsettled else None
        return EntityRelease(self.entity_key, self.owner, self.position,
                             self.applied_key if self.moved else "", orphan, self.kind)


class Lanes:
    """Groups a batch's claimed items into lanes, holding each ordered entity in the store."""

    def __init__(self, store: ProcessorStore, now: Callable[[], datetime], wait: float,
                 sleep: Callable[[float], None] = time.sleep,
                 redrive_after: timedelta = timedelta(seconds=1200),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.now, self.wait = store, now, wait
        self._sleep, self._redrive_after, self._monotonic = sleep, redrive_after, monotonic

    def busy(self, item: Item) -> Pending:
        """Give ``item``'s claim back (its entity is held elsewhere): PENDING, due for the
        store's redrive if the broker never brings it back, IN_PROGRESS (503)."""
        return _busy(item, self.store.now() + self._redrive_after)

    @staticmethod
    def takes(wanted: Sequence[Item]) -> dict[str, EntityTake] | None:
        """The entities the claim of ``wanted`` holds too (``claim_many(takes=)``); None: none."""
        groups = _groups(wanted)
        return {key: _take(items) for key, items in groups.items()} if groups else None

    def of(self, claimed: Sequence[Item], holds: EntityHolds | None = None,
           claimed_at: float | None = None) -> list[Lane]:
        """The lanes of ``claimed``; items of a busy entity get their unclaim and IN_PROGRESS.

        ``holds``: the entities the claim held already; the others are taken here.
        ``claimed_at``: when (this process's monotonic clock) the claim's round trip
        began, the age of the holds it took (None: now).
        """
        lanes = [Lane([item]) for item in claimed if _ordering(item) is None]
        groups = _groups(claimed)
        if groups:
            lanes += self._held(groups, holds,
                                self._monotonic() if claimed_at is None else claimed_at)
        return lanes

    def _held(self, groups: dict[str, list[Item]], given: EntityHolds | None,
              claimed_at: float) -> list[Lane]:
        since = dict.fromkeys(groups, claimed_at)
        holds = self._take(groups, given, since)
        lanes = []
        for entity_key, items in groups.items():
            if holds.held(entity_key):
                lanes.append(self._lane(entity_key, items, holds, since[entity_key]))
            else:
                for item in items:
                    item.pending = self.busy(item)
        return lanes

    def _take(self, groups: Mapping[str, list[Item]], given: EntityHolds | None,
              since: dict[str, float]) -> EntityHolds:
        """Hold the entities the claim did not; ``since`` gets when each one's taking
        round trip began (the lease the store gave it is no older)."""
        takes = {key: _take(items) for key, items in groups.items()
                 if given is None or not given.held(key)}
        if given is not None and not takes:
            return given
        at = self._monotonic()
        holds = self.store.take_entities(takes, self.now())
        since.update(dict.fromkeys(takes, at))
        if given is not None:
            holds = _merged(given, holds, list(takes))
        busy = [key for key in takes if not holds.held(key)]
        for _ in range(round(self.wait / _POLL)):
            if not busy:
                break
            self._sleep(_POLL)
            at = self._monotonic()
            again = self.store.take_entities({key: takes[key] for key in busy}, self.now())
            holds = _merged(holds, again, busy)
            since.update(dict.fromkeys(busy, at))
            busy = [key for key in busy if not again.held(key)]
        return holds

    def _lane(self, entity_key: str, items: list[Item], holds: EntityHolds,
              since: float) -> Lane:
        record = holds.records[entity_key]
        lane = Lane(items, entity_key, holds.owner_of(entity_key), record.get("position"),
                    str(record.get("applied_key") or ""), confirmed=since)
        lane.kind = str(record.get("position_kind") or UNTAGGED)
        self._roll_forward(lane, record.get("orphan"))
        return lane

    def _roll_forward(self, lane: Lane, orphan: Any) -> None:
        # A holder that crashed between an event's SUCCESS and the release:
        # its newest successful (not stale) event is the entity's position.
        if not isinstance(orphan, Mapping) or not orphan.get("keys"):
            return
        positions = dict(zip(orphan.get("keys") or [], orphan.get("positions") or [],
                             strict=False))
        found = {str(record.get("idempotency_key")): record
                 for record in self.store.get_many(list(positions))}
        lane.unsettled = {key: positions[key] for key in positions
                          if not _settled(found.get(key)) and key not in _keys(lane)}
        for key, record in found.items():
            done = record.get("event_status") == Status.SUCCESS and not record.get("stale")
            position, kind = positions.get(key), _applied_kind(record)
            # A SUCCESS of another kind cannot have been applied over this position.
            if done and position is not None and (lane.position is None or (
                    comparable(kind, lane.kind) and position > lane.position)):
                lane.position, lane.applied_key, lane.moved = position, key, True
                lane.kind = kind or lane.kind


def stale_pending(item: Item, lane: Lane) -> Pending:
    """SUCCESS as stale: the handler never runs; the record says which position won.

    An event of another kind than the applied position is not older, it cannot be
    ordered at all: stored FAILED for good instead (``mismatch_pending``)."""
    assert item.claim is not None
    why = lane.mismatched(item)
    if why is not None:
        return mismatch_pending(item, why)
    order = _order(item)
    stale = {"position": order.position, "applied_position": lane.position,
             "applied_key": lane.applied_key, "entity_key": order.entity_key}
    return Pending(Finish(item.key, item.claim.owner, extra={"stale": stale}),
                   Result(Outcome.STALE, key=item.key, event_type=item.event_type,
                          attempt=item.claim.attempt))


def mismatch_pending(item: Item, why: str) -> Pending:
    """FAILED for good (acked, never run): ``item``'s position cannot be compared with its
    entity's applied one. The same write as any permanent failure; every retry would
    meet the same applied position, so none is offered."""
    assert item.claim is not None
    exc = PositionKindMismatch(why)
    finish = Finish(item.key, item.claim.owner, error=documents.error_document(exc, "permanent"),
                    retryable=False)
    return Pending(finish, Result(Outcome.REJECTED, key=item.key, event_type=item.event_type,
                                  attempt=item.claim.attempt, error=brief(exc)),
                   (logging.ERROR, f"position kind mismatch on {item.key}: {why}"))


def applied_fields(item: Item) -> dict[str, Any]:
    """What an ordered event's SUCCESS stores of its order (its kind: for a roll-forward)."""
    order = _order(item)
    return {"order": {"entity_key": order.entity_key, "position": order.position,
                      "kind": order.kind}}


def _applied_kind(record: Mapping[str, Any]) -> str:
    """The kind a SUCCESS record stored with its order (untagged before kinds were)."""
    order = record.get("order")
    return str(order.get("kind") or UNTAGGED) if isinstance(order, Mapping) else UNTAGGED


def _settled(record: Mapping[str, Any] | None) -> bool:
    """False while ``record`` is PROCESSING: its (maybe paused) holder could still store it.

    Any other state is safe to forget: a record that comes back later is
    claimed again and compared with the position then."""
    return (record or {}).get("event_status") != Status.PROCESSING


def _keys(lane: Lane) -> set[str]:
    return {item.key for item in lane.items}


def _busy(item: Item, redrive_at: datetime) -> Pending:
    assert item.claim is not None
    return Pending(Finish(item.key, item.claim.owner, unclaim=True, redrive_at=redrive_at),
                   Result(Outcome.IN_PROGRESS, key=item.key, event_type=item.event_type,
                          attempt=item.claim.attempt - 1, error="EntityBusy"))


def _groups(items: Sequence[Item]) -> dict[str, list[Item]]:
    """The ordered items by entity, each entity's by kind, then in position order (ties by
    key): a lane of mixed kinds runs one kind's events in order, then the other's."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        if (order := _ordering(item)) is not None:
            groups.setdefault(order.entity_key, []).append(item)
    for members in groups.values():
        members.sort(key=lambda item: (_order(item).kind, _order(item).position, item.key))
    return groups


def _take(items: Sequence[Item]) -> EntityTake:
    first = _order(items[0])
    kinds = {_order(item).kind for item in items}
    return EntityTake(first.fields(), tuple(item.key for item in items),
                      tuple(_order(item).position for item in items),
                      kinds.pop() if len(kinds) == 1 else "")


def _merged(holds: EntityHolds, again: EntityHolds, retried: Sequence[str]) -> EntityHolds:
    owners = dict(holds.owners)
    owners.update({key: again.owner for key in retried if again.held(key)})
    return EntityHolds(holds.owner, {**holds.records, **{k: again.records[k] for k in retried}},
                       owners)


def _ordering(item: Item) -> Ordering | None:
    return item.located.order if item.located is not None else None


def _order(item: Item) -> Ordering:
    order = _ordering(item)
    assert order is not None
    return order
