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
each of a lane's events, its first too (a batch's lanes run one after the
other), when a quarter lease passed since (a process paused past its lease
finds out there, and gives the rest of its lane back), and the release only
takes while the hold holds; the position only moves forward.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.order import Ordering, Position
from eventbus.model.outcome import Outcome
from eventbus.model.status import Status
from eventbus.processor.heartbeat import Lease
from eventbus.processor.work import Item, Pending, Result
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
    """When (this process's monotonic clock) the hold was last known to hold."""
    unsettled: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Orphan keys (→ positions) whose records were not finished when read: kept at release."""

    def stale(self, item: Item) -> bool:
        """True when ``item`` is older than the entity's applied position."""
        order = _order(item)
        return self.position is not None and order.position < self.position

    def applied(self, item: Item) -> None:
        """``item`` succeeded: its position is the entity's now."""
        self.position, self.applied_key, self.moved = _order(item).position, item.key, True

    def release(self) -> EntityRelease:
        """What the finish stage stores for the entity: its position, and no holder."""
        orphan = {"keys": list(self.unsettled), "positions": list(self.unsettled.values())} \
            if self.unsettled else None
        return EntityRelease(self.entity_key, self.owner, self.position,
                             self.applied_key if self.moved else "", orphan)


class Lanes:
    """Groups a batch's claimed items into lanes, holding each ordered entity in the store."""

    def __init__(self, store: ProcessorStore, now: Callable[[], datetime], wait: float,
                 sleep: Callable[[float], None] = time.sleep,
                 redrive_after: timedelta = timedelta(seconds=1200)) -> None:
        self.store, self.now, self.wait = store, now, wait
        self._sleep, self._redrive_after = sleep, redrive_after

    def busy(self, item: Item) -> Pending:
        """Give ``item``'s claim back (its entity is held elsewhere): PENDING, due for the
        store's redrive if the broker never brings it back, IN_PROGRESS (503)."""
        return _busy(item, self.store.now() + self._redrive_after)

    @staticmethod
    def takes(wanted: Sequence[Item]) -> dict[str, EntityTake] | None:
        """The entities the claim of ``wanted`` holds too (``claim_many(takes=)``); None: none."""
        groups = _groups(wanted)
        return {key: _take(items) for key, items in groups.items()} if groups else None

    def of(self, claimed: Sequence[Item], holds: EntityHolds | None = None) -> list[Lane]:
        """The lanes of ``claimed``; items of a busy entity get their unclaim and IN_PROGRESS.

        ``holds``: the entities the claim held already; the others are taken here.
        """
        lanes = [Lane([item]) for item in claimed if _ordering(item) is None]
        groups = _groups(claimed)
        if groups:
            lanes += self._held(groups, holds)
        return lanes

    def _held(self, groups: dict[str, list[Item]], given: EntityHolds | None) -> list[Lane]:
        holds = self._take(groups, given)
        lanes = []
        for entity_key, items in groups.items():
            if holds.held(entity_key):
                lanes.append(self._lane(entity_key, items, holds))
            else:
                for item in items:
                    item.pending = self.busy(item)
        return lanes

    def _take(self, groups: Mapping[str, list[Item]], given: EntityHolds | None) -> EntityHolds:
        takes = {key: _take(items) for key, items in groups.items()
                 if given is None or not given.held(key)}
        if given is not None and not takes:
            return given
        holds = self.store.take_entities(takes, self.now())
        if given is not None:
            holds = _merged(given, holds, list(takes))
        busy = [key for key in takes if not holds.held(key)]
        for _ in range(round(self.wait / _POLL)):
            if not busy:
                break
            self._sleep(_POLL)
            again = self.store.take_entities({key: takes[key] for key in busy}, self.now())
            holds = _merged(holds, again, busy)
            busy = [key for key in busy if not again.held(key)]
        return holds

    def _lane(self, entity_key: str, items: list[Item], holds: EntityHolds) -> Lane:
        record = holds.records[entity_key]
        lane = Lane(items, entity_key, holds.owner_of(entity_key), record.get("position"),
                    str(record.get("applied_key") or ""))
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
            position = positions.get(key)
            if done and position is not None and (lane.position is None
                                                  or position > lane.position):
                lane.position, lane.applied_key, lane.moved = position, key, True


def stale_pending(item: Item, lane: Lane) -> Pending:
    """SUCCESS as stale: the handler never runs; the record says which position won."""
    assert item.claim is not None
    order = _order(item)
    stale = {"position": order.position, "applied_position": lane.position,
             "applied_key": lane.applied_key, "entity_key": order.entity_key}
    return Pending(Finish(item.key, item.claim.owner, extra={"stale": stale}),
                   Result(Outcome.STALE, key=item.key, event_type=item.event_type,
                          attempt=item.claim.attempt))


def applied_fields(item: Item) -> dict[str, Any]:
    """What an ordered event's SUCCESS stores of its order."""
    order = _order(item)
    return {"order": {"entity_key": order.entity_key, "position": order.position}}


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
    """The ordered items by entity, each entity's in position order (ties by key)."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        if (order := _ordering(item)) is not None:
            groups.setdefault(order.entity_key, []).append(item)
    for members in groups.values():
        members.sort(key=lambda item: (_order(item).position, item.key))
    return groups


def _take(items: Sequence[Item]) -> EntityTake:
    first = _order(items[0])
    return EntityTake(first.fields(), tuple(item.key for item in items),
                      tuple(_order(item).position for item in items))


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
