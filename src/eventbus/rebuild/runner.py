"""``eventbus rebuild``: run chosen handlers again over stored SUCCESS events, in replay mode.

A rebuild is a **batch source** for the one pipeline, as the pull worker is:
it plans which events run (a ``Source``), loads them a batch at a time as
deliveries with their records, and hands each batch to a ``ReplayProcessor``
(``eventbus.rebuild.mode``): one lease round trip, one finish round trip
per batch, the handlers in replay mode. Around the batches it keeps:

* **the plan**: the selection's keys in run order: by ``created``, except that
  an ordered handler's events (their stored ``order``) run together, in their
  entity's position order, from the place of the entity's first event;
* **a frozen plan** in the store (``rebuild_plan_save``), written once before
  the first event runs: ``--resume`` runs the keys and the order of the first
  run's plan, not a query's answer now (events that finished since would join it);
* **a checkpoint** in the store (``rebuild_save``: the run document with its
  selection, flags, counts and how far the plan is done), written at most once
  a second and at the end; ``--resume ID`` reads it and the frozen plan, runs
  first the keys the run left **unfinished** (busy entity, a lease still held by
  a dead run, the store away: ``Report.unfinished``, which the checkpoint's last
  key has passed) and goes on after its last key.
  Nothing runs twice even where the checkpoint lags: the claim refuses a
  record that already has an audit entry of this rebuild;
* **a rate** (``RateLimit``), **a progress line**, and **a report**: counts,
  each failure with its reason, each new child (emitted or not).

``Source`` is what both sources implement: ``plan()`` the keys in order,
``load(keys)`` their deliveries and records. ``StoredSource`` reads the
store's SUCCESS records; ``ArchiveSource`` (``--from-archive``) reads the
messages an archive holds (``eventbus.rebuild.archive``), for events whose
records expired or never existed here: a key without a record runs as a new
record (``eventbus.rebuild.mode``), one with a record as a stored one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.model.status import Status
from eventbus.processor.intake import Located
from eventbus.processor.work import Result
from eventbus.rebuild.mode import ReplayProcessor
from eventbus.rebuild.store import RunStore
from eventbus.store.base import Record
from eventbus.store.operator_queries import EventQuery
from eventbus.workers.original import NotReplayable, ordering_key, stored_attributes, stored_event
from eventbus.workers.rate import RateLimit

PLAN_FIELDS = ("idempotency_key", "created", "order", "event_status")
AGAIN = tuple(outcome for outcome in Outcome if outcome.facts.again)
"""Outcomes that leave the event to run again in this rebuild (busy, store away)."""
_MOST_LISTED = 200
"""The most failures and new children a run document keeps (the report has them all)."""


class Source(Protocol):
    """Where a rebuild's events come from: the store (``StoredSource``), later an archive."""

    def plan(self) -> list[str]:
        """The keys to rebuild, in run order."""
        ...

    def load(self, keys: Sequence[str]) -> list[tuple[Delivery, Record | None]]:
        """The delivery and stored record (None: none) of each key that can run."""
        ...

    @property
    def missing(self) -> list[str]:
        """Keys asked for by name that the source does not hold."""
        ...

    @property
    def unreadable(self) -> list[tuple[str, str]]:
        """What cannot be rebuilt (a key or a place, and why), listed as failures."""
        ...


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which stored events a rebuild runs: a query, or a list of keys (frozen at start)."""

    query: EventQuery
    keys: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The selection as stored in the run document."""
        fields = {name: value for name, value in dataclasses.asdict(self.query).items()
                  if value not in (None, ())}
        return {"query": fields, "keys": list(self.keys)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Selection:
        """The selection a run document stored."""
        query = dict(data.get("query") or {})
        if "statuses" in query:
            query["statuses"] = tuple(query["statuses"])
        return cls(EventQuery(**query), tuple(data.get("keys") or ()))


class StoredSource:
    """The selection's SUCCESS records in the store (read in pages of ``page``)."""

    def __init__(self, store: Any, selection: Selection, *, page: int = 500,
                 limit: int = 10_000_000) -> None:
        self.store, self.selection, self.page, self.limit = store, selection, page, limit
        self.missing: list[str] = []
        self.unreadable: list[tuple[str, str]] = []
        self._cache: dict[str, Record] = {}

    def plan(self) -> list[str]:
        """The selected keys in run order (``run_order``); unknown given keys in ``missing``."""
        if self.selection.keys:
            rows = []
            for start in range(0, len(self.selection.keys), self.page):
                chunk = list(self.selection.keys[start:start + self.page])
                found = self.store.get_many(chunk)
                known = {str(r.get("idempotency_key")) for r in found}
                self.missing += [key for key in chunk if key not in known]
                rows += found
        else:
            query = dataclasses.replace(self.selection.query, statuses=(Status.SUCCESS.value,))
            rows = self.store.find_events(query, limit=self.limit, fields=list(PLAN_FIELDS))
        return run_order(rows)

    def resume(self, plan: Sequence[str]) -> None:
        """Take ``plan``, a run's stored plan, as planned here: a given key it lacks is
        ``missing``, as ``plan()`` found it then (no read: the plan holds what was found)."""
        planned = set(plan)
        self.missing = [key for key in self.selection.keys if key not in planned]

    def load(self, keys: Sequence[str]) -> list[tuple[Delivery, Record | None]]:
        """The keys' records (read a page ahead) as the deliveries they came from."""
        wanted = [key for key in keys if key not in self._cache]
        if wanted:
            self._cache.update({str(r["idempotency_key"]): r
                                for r in self.store.get_many(wanted)})
        out: list[tuple[Delivery, Record | None]] = []
        for key in keys:
            record = self._cache.pop(key, None)
            if record is None:
                continue
            try:
                out.append((delivery_of(record), record))
            except NotReplayable as exc:
                self.unreadable.append((key, str(exc)))
        return out

    def prefetch(self, keys: Sequence[str]) -> None:
        """Read the records of ``keys`` in one round trip, for the next ``load`` calls."""
        wanted = [key for key in keys if key not in self._cache]
        if wanted:
            self._cache.update({str(r["idempotency_key"]): r
                                for r in self.store.get_many(wanted)})


class ArchiveSource:
    """The messages of an archive (``read_archive``: a directory or ``gs://`` prefix).

    ``plan()`` reads the whole archive once, keeps the selected messages'
    deliveries (the selection's filters on the event, ``since``/``until`` on the
    publish time, its keys if given; the first copy of a key the archive holds
    twice), and lists every ``ArchiveProblem``, and every message that cannot
    run (a child whose parent has no record, an unknown type), in
    ``unreadable``: each is one failure of the report, and nothing else stops.
    The kept messages are held in memory, so a year's archive is best read a
    prefix (days) or a filter at a time. ``load(keys)`` pairs each with its
    stored record, or None: a new record.
    """

    def __init__(self, store: Any, path: str, locate: Callable[[Delivery], Located], *,
                 selection: Selection | None = None, storage_client: Any = None,
                 page: int = 500) -> None:
        self.store, self.path, self.locate, self.page = store, path, locate, page
        self.selection, self.storage_client = selection, storage_client
        self.missing: list[str] = []
        self.unreadable: list[tuple[str, str]] = []
        self.event_types: dict[str, str] = {}
        self._deliveries: dict[str, Delivery] = {}

    def plan(self) -> list[str]:
        """The selected messages' keys in run order (``run_order``, by publish time)."""
        from eventbus.rebuild.archive import ArchiveProblem, read_archive, to_delivery

        rows: list[dict[str, Any]] = []
        self._deliveries, self.unreadable, self.missing = {}, [], []
        for found in read_archive(self.path, storage_client=self.storage_client):
            if isinstance(found, ArchiveProblem):
                self.unreadable.append(_where(found))
                continue
            delivery = to_delivery(found)
            if isinstance(delivery, ArchiveProblem):
                self.unreadable.append(_where(delivery))
                continue
            located = self.locate(delivery)
            if located.error is not None or located.event is None:
                self.unreadable.append((f"{found.file} record {found.index}",
                                        f"not rebuildable: {located.error}"))
                continue
            if located.key in self._deliveries or not self._selected(located, found.publish_time):
                continue  # the archive is at-least-once: a second copy is the same event
            self._deliveries[located.key] = delivery
            self.event_types[located.key] = located.event.event_type
            order = located.order
            rows.append({"idempotency_key": located.key,
                         "created": found.publish_time.isoformat(),
                         "order": {"entity_key": order.entity_key, "position": order.position}
                         if order is not None else None})
        if self.selection is not None and self.selection.keys:
            self.missing = [key for key in self.selection.keys if key not in self._deliveries]
        return run_order(rows)

    def _selected(self, located: Located, published: datetime) -> bool:
        selection = self.selection
        if selection is None:
            return True
        if selection.keys and located.key not in selection.keys:
            return False
        from eventbus.rebuild.archive import selected  # as in plan(): the archive's part only

        assert located.event is not None
        return selected(selection.query, located.event, published)

    def load(self, keys: Sequence[str]) -> list[tuple[Delivery, Record | None]]:
        """Each key's archived delivery and its stored record (None: none), one read."""
        held = [key for key in keys if key in self._deliveries]
        records = {str(r.get("idempotency_key")): r
                   for r in self.store.get_many(held)} if held else {}
        return [(self._deliveries[key], records.get(key)) for key in held]


def _where(problem: Any) -> tuple[str, str]:
    """An ``ArchiveProblem`` as a report's failure: where (file, record), and why."""
    text = str(problem)
    return text[:len(text) - len(problem.reason) - 2], f"archive: {problem.reason}"


def delivery_of(record: Mapping[str, Any]) -> Delivery:
    """The delivery a stored record came from (its event, attributes, ordering key)."""
    from eventbus.model.keys import canonical_json

    event = stored_event(record)
    attributes = stored_attributes(record, event)
    found = record.get("pubsub")
    pubsub: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    return Delivery(canonical_json(event.to_document()).encode(), attributes,
                    message_id=str(pubsub.get("messageId") or "rebuild"),
                    ordering_key=ordering_key(record) or "", form="rebuild")


def run_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Keys by ``created``; an entity's ordered events together, by position, at its first."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    singles: list[Mapping[str, Any]] = []
    for row in rows:
        order = row.get("order")
        entity = order.get("entity_key") if isinstance(order, Mapping) else None
        (groups.setdefault(str(entity), []) if entity else singles).append(row)
    slots: list[tuple[tuple[str, str], list[str]]] = [
        ((_text(row.get("created")), str(row.get("idempotency_key"))),
         [str(row.get("idempotency_key"))]) for row in singles]
    for members in groups.values():
        try:
            members.sort(key=lambda r: (r["order"].get("position"), str(r["idempotency_key"])))
        except TypeError:  # positions of mixed types: fall back to arrival
            members.sort(key=lambda r: (_text(r.get("created")), str(r["idempotency_key"])))
        first = min((_text(r.get("created")), str(r["idempotency_key"])) for r in members)
        slots.append((first, [str(r["idempotency_key"]) for r in members]))
    slots.sort(key=lambda slot: slot[0])
    return [key for _, keys in slots for key in keys]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclasses.dataclass
class Report:
    """What a rebuild did: counts, failures, new children; the run document's contents."""

    rebuild_id: str
    total: int = 0
    done: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("rebuilt", "failed", "skipped", "stale", "already", "busy"), 0))
    failures: list[dict[str, str]] = dataclasses.field(default_factory=list)
    new_children: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)
    last_key: str = ""
    unfinished: list[str] = dataclasses.field(default_factory=list)
    """Keys passed by ``last_key`` that did not run (counted ``busy``): ``--resume`` runs
    them again first, so the checkpoint never skips them."""

    def add(self, result: Result) -> None:
        """Count one event's result."""
        detail = result.detail or {}
        if result.outcome is Outcome.PROCESSED:
            self.counts["rebuilt"] += 1
            self.new_children += [{"parent": result.key, "key": key,
                                   "emitted": bool(detail.get("emitted"))}
                                  for key in detail.get("new_children") or []]
        elif result.outcome is Outcome.REJECTED:
            self.counts["failed"] += 1
            self.failures.append({"key": result.key,
                                  "reason": str(detail.get("failed") or result.error)})
        elif result.outcome in AGAIN:
            self.counts["busy"] += 1
            why = result.error or result.outcome.value
            self.failures.append({"key": result.key, "reason": f"not run: {why}"})
            self.unfinished.append(result.key)
        elif detail.get("stale") is not None:
            self.counts["stale"] += 1
            self.skipped.append({"key": result.key, "reason": str(detail.get("skipped", ""))})
        elif detail.get("skipped") == "already rebuilt by this rebuild":
            self.counts["already"] += 1
        else:
            self.counts["skipped"] += 1
            self.skipped.append({"key": result.key, "reason": str(detail.get("skipped", ""))})

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Rebuild:
    """One rebuild run: a source, a replay processor, the run store's checkpoint; ``run()``."""

    runs: RunStore
    """Where the run document and the frozen plan are kept (``eventbus.rebuild.store``)."""
    processor: ReplayProcessor
    source: Source
    run_document: dict[str, Any]
    batch: int = 100
    limit: RateLimit = dataclasses.field(default_factory=lambda: RateLimit(None))
    progress: Callable[[Report], None] = lambda report: None
    retries: int = 20
    """Rounds an event whose entity is busy (or whose store was away) is tried again."""
    pause: float = 0.25
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    report: Report = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        """Start the report from the run document (a resumed run keeps its counts)."""
        run = self.run_document
        self.report = Report(str(run["rebuild_id"]))
        saved = run.get("report")
        if isinstance(saved, Mapping):
            self.report.counts.update(saved.get("counts") or {})
            self.report.done = int(saved.get("done") or 0)
            self.report.last_key = str(saved.get("last_key") or "")
            self.report.unfinished = [str(key) for key in saved.get("unfinished") or []]

    def run(self, stop_after: int | None = None) -> Report:
        """Run the rest of the plan; ``stop_after`` events (tests: an interruption)."""
        plan = self._plan()
        keys = self._rest(plan)
        left = self._left(plan, keys)
        self.report.total = self.report.done + len(keys)
        self._save("running")
        saved_at = self.monotonic()
        ran = 0
        for chunk in _chunks(left, self.batch):
            # Before the rest: an entity's older events run before its later ones.
            self._batch(chunk)
        for chunk in _chunks(keys, self.batch):
            if stop_after is not None and ran >= stop_after:
                self._save("interrupted")
                return self.report
            if isinstance(self.source, StoredSource):
                self.source.prefetch(chunk)
            for _ in chunk:
                self.limit.wait()
            self._batch(chunk)
            ran += len(chunk)
            self.report.done += len(chunk)
            self.report.last_key = chunk[-1]
            self.progress(self.report)
            if self.monotonic() - saved_at >= 1.0:
                self._save("running")
                saved_at = self.monotonic()
        for key, why in self.source.unreadable:
            self.report.counts["failed"] += 1
            self.report.failures.append({"key": key, "reason": f"cannot be rebuilt: {why}"})
        self._save("finished")
        return self.report

    def _plan(self) -> list[str]:
        """The run's frozen plan: the one stored at its first start, else planned and stored.

        The checkpoint's ``last_key`` is a place in this plan, so a resumed run
        must see the same plan: planned again, a query may also match events
        that finished since, and an ordered one joining its entity's group can
        move the group before ``last_key`` (simulation seed 80: the resume
        skipped two keys its first run never ran). The archive is still read
        (its deliveries are what ``load`` returns); only the order is kept.
        """
        rebuild_id, frozen = str(self.run_document["rebuild_id"]), self.run_document.get("plan")
        size = frozen.get("keys") if isinstance(frozen, Mapping) else None
        saved = self.runs.rebuild_plan(rebuild_id) if size is not None else None
        if saved is not None and len(saved) == size:
            if isinstance(self.source, StoredSource):
                self.source.resume(saved)
            else:
                self.source.plan()
            return saved
        plan = self.source.plan()
        self.runs.rebuild_plan_save(rebuild_id, plan)
        self.run_document["plan"] = {"keys": len(plan)}
        return plan

    def _rest(self, plan: list[str]) -> list[str]:
        last = self.report.last_key
        if last and last in plan:
            return plan[plan.index(last) + 1:]
        self.report.done = 0  # the key is gone (expired): start over; the claims skip done ones
        return plan

    def _left(self, plan: list[str], rest: list[str]) -> list[str]:
        """The keys an earlier run of this rebuild left unfinished, in plan order, that the
        rest does not hold; taken off the report's ``unfinished`` and ``busy`` (run again)."""
        unfinished, ahead = set(self.report.unfinished), set(rest)
        left = [key for key in plan if key in unfinished and key not in ahead]
        self.report.unfinished = []
        self.report.counts["busy"] = max(0, self.report.counts["busy"] - len(unfinished))
        return left

    def _batch(self, keys: Sequence[str]) -> None:
        pairs = self.source.load(keys)
        for attempt in range(self.retries + 1):
            results = self.processor.rebuild(pairs)
            again = [pair for pair, result in zip(pairs, results, strict=True)
                     if result.outcome in AGAIN]
            for (_, record), result in zip(pairs, results, strict=True):
                if result.outcome not in AGAIN or attempt == self.retries:
                    self.report.add(_keyed(result, record))
            if not again:
                return
            # Its entity is held by a live delivery (or the store was away): the same
            # events again, before any later one, so each entity keeps its order.
            pairs = again
            self.sleep(self.pause)

    def _save(self, status: str) -> None:
        report = self.report.to_json()
        report["failures"] = report["failures"][:_MOST_LISTED]
        report["new_children"] = report["new_children"][:_MOST_LISTED]
        report["skipped"] = report["skipped"][:_MOST_LISTED]
        self.run_document.update(status=status, report=report, counts=dict(self.report.counts),
                                 done=self.report.done, total=self.report.total)
        if status in ("finished", "interrupted"):
            self.run_document["ended"] = self.runs.now()
        self.runs.rebuild_save(self.run_document)


def _keyed(result: Result, record: Mapping[str, Any] | None) -> Result:
    if result.key or record is None:
        return result
    return dataclasses.replace(result, key=str(record.get("idempotency_key")))


def _chunks(keys: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(keys), size):
        yield list(keys[start:start + size])


def new_run(*, by: str, why: str, started: datetime, selection: Selection,
            flags: Mapping[str, bool], rebuild_id: str | None = None,
            archive: str | None = None) -> dict[str, Any]:
    """The run document of a new rebuild (its id is a fresh ``rb-…`` unless given).

    ``archive``: the ``--from-archive`` path, so ``--resume`` reads the same archive.
    """
    run = {"rebuild_id": rebuild_id or f"rb-{uuid.uuid4().hex[:12]}", "by": by, "why": why,
           "started": started, "selection": selection.to_json(), "flags": dict(flags),
           "status": "planned"}
    if archive is not None:
        run["archive"] = archive
    return run


QUIET = 300.0
"""Seconds without a checkpoint after which a ``running`` rebuild is shown as quiet: the
checkpoint is saved at least once a second while batches finish, so its process most
likely stopped (``--resume`` goes on)."""


@dataclasses.dataclass(frozen=True)
class RunView:
    """One rebuild as the console lists it (``run_views``): plain, display-ready values."""

    rebuild_id: str
    status: str
    by: str
    why: str
    started: str
    ended: str
    done: int
    total: int
    counts: dict[str, int]
    source: str
    """``store`` or the archive's path."""
    flags: str
    quiet: bool
    """Running, but no checkpoint for ``QUIET`` seconds."""

    @property
    def percent(self) -> int:
        """How far, 0 to 100."""
        return 100 * self.done // self.total if self.total else 100


def run_views(store: RunStore, now: datetime, limit: int = 50) -> list[RunView]:
    """The ``limit`` newest rebuilds (``rebuild_runs``), running and finished, newest first."""
    return [_run_view(run, now) for run in store.rebuild_runs(limit)]


def _run_view(run: Mapping[str, Any], now: datetime) -> RunView:
    counts = run.get("counts")
    flags = run.get("flags")
    updated = run.get("updated_at")
    status = str(run.get("status") or "")
    quiet = status == "running" and isinstance(updated, datetime) and \
        (_aware(now) - _aware(updated)).total_seconds() > QUIET
    return RunView(
        rebuild_id=str(run.get("rebuild_id") or run.get("_id") or ""), status=status,
        by=str(run.get("by") or ""), why=str(run.get("why") or ""),
        started=_when(run.get("started")), ended=_when(run.get("ended")),
        done=_count(run.get("done")), total=_count(run.get("total")),
        counts={str(name): _count(value) for name, value in counts.items()}
        if isinstance(counts, Mapping) else {},
        source=str(run.get("archive") or "store"),
        flags=", ".join(name for name, on in flags.items() if on)
        if isinstance(flags, Mapping) else "",
        quiet=quiet)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _aware(moment: datetime) -> datetime:
    """A naive time (as BSON gives it back) is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return _aware(value).strftime("%Y-%m-%d %H:%M:%SZ")
    return "" if value is None else str(value)
