"""Verify archived events: what was recorded is the stored record, else the archive itself.

``eventbus verify --from-archive PATH`` reads an archive (``eventbus.rebuild.archive``)
once into an ``ArchiveIndex``: every event it holds under the key the receiver
gives it, and every child grouped under its parent. A child carries its
cascade link in its attributes (the relay publishes it with ``idempotency_key``
= the child's key and ``parent_key`` = its parent's, ``eventbus.outbox.relay``),
and the children went to the same bus, so the archive holds them too.

For each selected event, ``ArchiveVerifier`` compares the current code with:

1. the **stored record**, when the store still has it: its outbox, children
   and forwards, exactly as ``eventbus verify`` without an archive does;
2. else **the archive**: the event's archived children (key, type, payload
   fingerprint), in the order their keys number them, made into the outbox of
   a stand-in record (``archived_record``). Forwards went to public topics, not
   to the bus, so they are not in the archive and are not compared here.

An event judged from the archive alone is **unverifiable** when the archive
cannot say what it emitted:

* the archive ends less than ``settle`` after the event was published: its
  children (published after its SUCCESS, by the inline relay within
  ``Settings.relay_budget_seconds``, else by the ``eventbus relay`` sweeper, or
  after retries) may not be in it yet, and "no children found" would read as
  "emitted nothing";
* its archived children are not numbered 0..n-1 (a child missing, a file
  lost), or one's key does not derive from its parent's key.

Otherwise an event with no archived children is compared as having emitted
nothing. The record's absence means it cannot be known whether the event
succeeded: one that failed for good in production and now emits is listed as
different (its children were never published).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import InvalidEvent
from eventbus.model.event import Event
from eventbus.model.keys import (
    REPLAY_OF,
    cascade_links,
    child_key,
    fingerprint,
    record_key,
)
from eventbus.model.status import Status
from eventbus.rebuild.archive import (
    ArchivedMessage,
    ArchiveProblem,
    archived_event,
    selected,
    to_delivery,
)
from eventbus.rebuild.archive.archived import problem
from eventbus.rebuild.verify.runner import Verdict, Verifier
from eventbus.rebuild.verify.sandbox import Lookups
from eventbus.store.documents import event_fields
from eventbus.store.operator_queries import EventQuery

SETTLE = dt.timedelta(hours=1)
"""Default: how long after an event the archive must run before "no children" means none.

The inline relay publishes children within seconds of the parent's SUCCESS
and the sweeper within a minute; an hour also covers the push subscription's
retries (backoff up to 10 minutes) of a parent that failed a few times first."""
_INDEX_SEARCH = 256
"""How far past its siblings' count a hashed child key (``c:…``) is looked for."""


@dataclasses.dataclass(frozen=True)
class ArchivedEvent:
    """One event of the archive under the key the receiver gives it (first copy kept)."""

    key: str
    event: Event
    delivery: Delivery
    published: dt.datetime
    parent_key: str = ""
    """The parent it claims (its ``parent_key`` attribute); empty for a publisher's event."""
    root_key: str = ""

    @property
    def fingerprint(self) -> str:
        """The payload's fingerprint, as the receiver and the parent's outbox compute it."""
        return fingerprint(self.event)


@dataclasses.dataclass
class ArchiveIndex:
    """What an archive holds: events by key, children by parent key, the problems."""

    events: dict[str, ArchivedEvent] = dataclasses.field(default_factory=dict)
    children: dict[str, list[ArchivedEvent]] = dataclasses.field(default_factory=dict)
    problems: list[ArchiveProblem] = dataclasses.field(default_factory=list)
    ends: dt.datetime | None = None
    """The latest publish time of any message read (the archive covers up to here)."""

    def add(self, found: ArchivedMessage | ArchiveProblem) -> None:
        """Take one item of ``read_archive``: a message indexed, or a problem kept."""
        if isinstance(found, ArchiveProblem):
            self.problems.append(found)
            return
        if self.ends is None or found.publish_time > self.ends:
            self.ends = found.publish_time
        archived = _archived(found)
        if isinstance(archived, ArchiveProblem):
            self.problems.append(archived)
            return
        known = self.events.get(archived.key)
        # The archive is at least once: a second copy is the same event. An operator's
        # corrected replay runs under the refused record's key and supersedes it.
        if known is not None and REPLAY_OF not in archived.delivery.attributes:
            return
        self.events[archived.key] = archived
        if archived.parent_key:
            siblings = self.children.setdefault(archived.parent_key, [])
            siblings[:] = [c for c in siblings if c.key != archived.key] + [archived]


def index_archive(found: Iterable[ArchivedMessage | ArchiveProblem]) -> ArchiveIndex:
    """Index ``read_archive``'s messages and problems (all held in memory)."""
    index = ArchiveIndex()
    for item in found:
        index.add(item)
    return index


def select_archived(index: ArchiveIndex, query: EventQuery, *, keys: Sequence[str] = (),
           limit: int | None = None) -> tuple[list[ArchivedEvent], list[str]]:
    """The archived events to verify, oldest first, and the ``keys`` the archive lacks.

    ``query``'s event filters apply to the event, ``since``/``until`` to its
    publish time; its statuses are ignored (an archive holds none). ``keys``,
    when given, narrow it to those keys; ``limit`` keeps the newest.
    """
    wanted = set(keys)
    chosen = [event for event in index.events.values()
              if (not wanted or event.key in wanted)
              and selected(query, event.event, event.published)]
    chosen.sort(key=lambda event: (event.published, event.key))
    if limit is not None:
        chosen = chosen[-limit:] if limit > 0 else []
    return chosen, [key for key in dict.fromkeys(keys) if key not in index.events]


def _archived(message: ArchivedMessage) -> ArchivedEvent | ArchiveProblem:
    """The message as an event under its key, or why the receiver never ran it."""
    event = archived_event(message)
    delivery = to_delivery(message)
    if isinstance(event, ArchiveProblem):
        return event
    if isinstance(delivery, ArchiveProblem):
        return delivery
    attributes = delivery.attributes
    try:
        if "parent_key" in attributes:
            links = cascade_links(attributes)
            key = attributes.get("idempotency_key", "")
            if not key or not links.get("parent_key"):
                raise InvalidEvent("a child without a usable key or parent_key")
            return ArchivedEvent(key, event, delivery, message.publish_time,
                                 links["parent_key"], links.get("root_key", ""))
        if attributes.get(REPLAY_OF):
            return ArchivedEvent(attributes[REPLAY_OF], event, delivery, message.publish_time)
        return ArchivedEvent(record_key(event, attributes), event, delivery,
                             message.publish_time)
    except InvalidEvent as exc:
        return problem(message.file, message.index, f"the receiver refuses it: {exc}",
                       message_id=message.message_id)


def archived_record(event: ArchivedEvent, children: Sequence[ArchivedEvent]) -> dict[str, Any]:
    """A stand-in stored record of ``event``: SUCCESS, its archived children as its outbox.

    ``children`` are in outbox order. Its times are the publish time (the
    sandbox's clock reads it as the time the record was written).
    """
    written = str(int(event.published.timestamp() * 1000))
    record = {"idempotency_key": event.key,
              **event_fields(event.event, event.delivery, fingerprint=event.fingerprint,
                             parent_key=event.parent_key,
                             root_key=event.root_key or event.parent_key),
              "event_status": Status.SUCCESS.value, "created": written,
              "lastUpdatedTime": written, "source": "archive"}
    record["outbox"] = [{"idempotency_key": child.key, **child.event.to_document(),
                         "ordering_key": child.delivery.ordering_key,
                         "parent_key": event.key, "root_key": child.root_key,
                         "status": Status.PUBLISHED.value,
                         "messageId": child.delivery.message_id,
                         "payload_fingerprint": child.fingerprint} for child in children]
    return record


def ordered_children(parent_key: str,
                     children: Sequence[ArchivedEvent]) -> tuple[list[ArchivedEvent], str]:
    """``children`` in the order their keys number them, or ([], why they cannot be).

    A child's key is ``child_key(parent, type, index)``: its index is read
    back from the key (or found by trying, for a hashed ``c:…`` key).
    """
    placed: dict[int, ArchivedEvent] = {}
    for child in children:
        index = _index(parent_key, child, len(children) + _INDEX_SEARCH)
        if index is None:
            return [], f"archived child {child.key!r} has a key its parent's does not derive"
        if index in placed:
            return [], f"two archived children are child {index} of it"
        placed[index] = child
    missing = sorted(set(range(len(placed))) - placed.keys())
    if missing or (placed and max(placed) != len(placed) - 1):
        held = ", ".join(str(i) for i in sorted(placed))
        return [], (f"the archive holds its children {held}, not 0..{max(placed)}: "
                    "some were not archived")
    return [placed[i] for i in range(len(placed))], ""


def _index(parent_key: str, child: ArchivedEvent, search: int) -> int | None:
    prefix = f"{parent_key}/"
    kind = child.event.event_type
    if child.key.startswith(prefix):
        number, _, rest = child.key[len(prefix):].partition(":")
        if number.isascii() and number.isdigit() and rest == kind and \
                child_key(parent_key, kind, int(number)) == child.key:
            return int(number)
    for index in range(search):  # a hashed key: which index gives it
        if child_key(parent_key, kind, index) == child.key:
            return index
    return None


class ArchiveLookups:
    """``Lookups`` of the stored records first, else the archive's stand-in records.

    A child is accepted only where its parent's outbox lists it: a parent whose
    record expired is answered with its stand-in, whose outbox is its
    archived children.
    """

    def __init__(self, stored: Lookups, index: ArchiveIndex) -> None:
        self.stored, self.index = stored, index
        self._made: dict[str, Mapping[str, Any]] = {}

    def event(self, key: str) -> Mapping[str, Any] | None:
        """The stored record of ``key``, else its archive stand-in, else None."""
        found = self.stored.event(key)
        if found is not None:
            return found
        if key not in self._made:
            archived = self.index.events.get(key)
            if archived is None:
                return None
            children, _ = ordered_children(key, self.index.children.get(key, []))
            self._made[key] = archived_record(archived, children)
        return self._made[key]

    def side_effect(self, key: str) -> Mapping[str, Any] | None:
        """The stored guard record of ``key`` (an archive holds none)."""
        return self.stored.side_effect(key)


class ArchiveVerifier:
    """Verdicts for archived events: on the stored record when there is one, else the archive.

    ``verifier`` runs on ``ArchiveLookups`` of the same ``index``; ``stored``
    holds the store's records of the selected keys (read in one go by the
    caller). ``settle``: see the module doc.
    """

    def __init__(self, verifier: Verifier, index: ArchiveIndex,
                 stored: Mapping[str, Mapping[str, Any]], *, settle: dt.timedelta = SETTLE
                 ) -> None:
        self.verifier, self.index, self.stored, self.settle = verifier, index, stored, settle

    def verify(self, selected: Iterable[ArchivedEvent]) -> Iterator[Verdict]:
        """The archive's problems (unreadable), then one verdict per selected event."""
        for bad in self.index.problems:
            where = str(bad)
            yield Verdict(where[:len(where) - len(bad.reason) - 2], "unreadable",
                          reason=f"archive: {bad.reason}")
        for event in selected:
            yield self.verify_one(event)

    def verify_one(self, event: ArchivedEvent) -> Verdict:
        """One event's verdict, on its record or its archived children."""
        record = self.stored.get(event.key)
        if record is not None:
            return dataclasses.replace(self.verifier.verify_one(record), basis="record")
        why = self.unjudgeable(event)
        if why:
            return Verdict(event.key, "unverifiable", event.event.event_type, reason=why,
                           basis="archive")
        children, _ = ordered_children(event.key, self.index.children.get(event.key, []))
        verdict = self.verifier.verify_one(archived_record(event, children), forwards=False)
        return dataclasses.replace(verdict, basis="archive")

    def unjudgeable(self, event: ArchivedEvent) -> str:
        """Why the archive cannot say what ``event`` emitted; empty when it can."""
        _, why = ordered_children(event.key, self.index.children.get(event.key, []))
        if why:
            return f"no stored record, and {why}"
        ends = self.index.ends
        if ends is None or ends - event.published < self.settle:
            after = 0 if ends is None else int((ends - event.published).total_seconds())
            return (f"no stored record, and the archive ends {after} s after it, within "
                    f"--settle {int(self.settle.total_seconds())} s: its children may not "
                    "be archived yet")
        return ""


__all__ = ["SETTLE", "ArchiveIndex", "ArchiveLookups", "ArchiveVerifier", "ArchivedEvent",
           "archived_record", "index_archive", "ordered_children", "select_archived"]
