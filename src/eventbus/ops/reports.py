"""What an operator asks of the stored events, shared by the ``eventbus`` commands and the console.

Seed 002's queries and a little arithmetic over them, through the store's
operator primitives (``eventbus.store.operator_queries``) only:

* ``failed_groups``: "Failed Events for Retry", grouped by cause (same event
  type, same error type and normalised message: one group, with an id that
  ``replay --group`` takes);
* ``history``: "Partner Event History", newest first;
* ``event_view``: one record with its attempt timeline and its cascade;
* ``stats`` and ``throughput``: counts in a time window, per type, status,
  partner and hour.

Nothing here prints: the commands render tables or JSON, the console HTML.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from eventbus.model.event import lookup
from eventbus.model.forward import is_forward
from eventbus.model.keys import digest
from eventbus.model.status import Status
from eventbus.ops import cascade
from eventbus.ops.render import from_epoch_ms, safe
from eventbus.store.base import Record
from eventbus.store.operator_queries import EventQuery

FAILED = Status.FAILED.value
SUCCESS = Status.SUCCESS.value
# The most FAILED records one grouping reads; more are reported as truncated.
FAILED_SCAN = 20_000
GROUP_ID_CHARS = 12
LIST_FIELDS = ("idempotency_key", "event_type", "event_status", "retryable", "error", "stale",
               "attempts", "entity_metadata", "created", "lastUpdatedTime",
               "replayed_at_attempt", "replays", "dead_lettered", "raw_payload")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}\b")
_HEX_ID = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b")
# An ISO 8601 / RFC 3339 time, date or time of day, whole: one mask, never half of one.
_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
                   r"(?:Z|[+-]\d{2}:?\d{2})?)?(?!\w)|\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?Z?(?!\w)")
# A number of four digits or more, or with a fraction; not a standard's name (RFC 3339).
_NUMBER = re.compile(r"(?<!RFC )(?<!ISO )\b\d+\.\d+\b|(?<!RFC )(?<!ISO )\d{4,}")
_SPACE = re.compile(r"\s+")
MAX_CAUSE = 200


def status_label(record: Mapping[str, Any]) -> str:
    """Return the record's status: FAILED split into retrying and for good, SUCCESS(stale)
    for an ordered handler's event older than its entity's applied position (never run)."""
    status = str(record.get("event_status", "?"))
    if status == FAILED:
        return "FAILED(retrying)" if record.get("retryable") is True else "FAILED(final)"
    if status == SUCCESS and record.get("stale"):
        return "SUCCESS(stale)"
    return status


# -- failed events, grouped by cause ------------------------------------------------------

def normalise(message: str) -> str:
    """Return an error message with its variable parts masked, the same way everywhere.

    Quoted values become ``<text>``, times (a whole timestamp, a date, a time of
    day) ``<time>``, UUIDs and long hex ids ``<id>``, numbers of four digits or
    more (or with a fraction) ``<number>``.
    """
    text = _QUOTED.sub("<text>", message)
    text = _TIME.sub("<time>", text)
    text = _UUID.sub("<id>", text)
    text = _HEX_ID.sub("<id>", text)
    text = _NUMBER.sub("<number>", text)
    return _SPACE.sub(" ", text).strip()[:MAX_CAUSE]


def cause(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """Return what groups a failure: its event type, error type and normalised message."""
    error = record.get("error")
    error = error if isinstance(error, Mapping) else {}
    return (str(record.get("event_type", "?")), str(error.get("type", "?")),
            normalise(str(error.get("message", ""))))


def group_id(event_type: str, error_type: str, message: str) -> str:
    """Return the short stable id of a cause, as ``replay --group`` takes it."""
    return digest(f"{event_type}\x00{error_type}\x00{message}")[:GROUP_ID_CHARS]


@dataclasses.dataclass
class Group:
    """Failed events of one cause."""

    id: str
    event_type: str
    error_type: str
    message: str
    keys: list[str] = dataclasses.field(default_factory=list)
    retrying: int = 0
    final: int = 0
    classifications: Counter[str] = dataclasses.field(default_factory=Counter)
    first: str = ""
    last: str = ""

    @property
    def count(self) -> int:
        """How many failed events have this cause."""
        return len(self.keys)

    def add(self, record: Mapping[str, Any]) -> None:
        """Count ``record`` in this group."""
        self.keys.append(str(record.get("idempotency_key")))
        retrying = record.get("retryable") is True
        self.retrying += retrying
        self.final += not retrying
        error = record.get("error")
        error = error if isinstance(error, Mapping) else {}
        self.classifications[str(error.get("classification", "?"))] += 1
        stamp = str(record.get("lastUpdatedTime") or record.get("created") or "")
        self.first = min(self.first, stamp) if self.first else stamp
        self.last = max(self.last, stamp)

    def to_json(self) -> dict[str, Any]:
        """Return the group as plain data (``--json``)."""
        return {"group": self.id, "event_type": self.event_type, "error_type": self.error_type,
                "message": self.message, "count": self.count, "retrying": self.retrying,
                "final": self.final, "classifications": dict(self.classifications),
                "first": self.first, "last": self.last, "keys": self.keys}


@dataclasses.dataclass
class FailedReport:
    """The failed events of a query, grouped; ``truncated`` when the scan limit was hit."""

    groups: list[Group]
    records: list[Record]
    truncated: bool


def failed_query(*, event_type: str | None = None, partner_id: str | None = None,
                 since: datetime | None = None, retryable: bool | None = None,
                 below_attempt: int | None = None) -> EventQuery:
    """Return seed 002's "Failed Events for Retry" query with the operator's filters."""
    return EventQuery(statuses=(FAILED,), event_type=event_type, partner_id=partner_id,
                      since=since, retryable=retryable, below_attempt=below_attempt)


def failed_groups(store: Any, query: EventQuery, scan: int = FAILED_SCAN) -> FailedReport:
    """Return the failed events of ``query`` grouped by cause, largest group first."""
    records = store.find_events(query, limit=scan + 1, fields=LIST_FIELDS)
    truncated = len(records) > scan
    records = records[:scan]
    groups: dict[str, Group] = {}
    for record in records:
        event_type, error_type, message = cause(record)
        key = group_id(event_type, error_type, message)
        groups.setdefault(key, Group(key, event_type, error_type, message)).add(record)
    ordered = sorted(groups.values(), key=lambda group: (-group.count, group.id))
    return FailedReport(ordered, records, truncated)


def find_group(report: FailedReport, wanted: str) -> Group | None:
    """Return the group whose id is ``wanted`` (or starts with it, when unambiguous)."""
    matching = [group for group in report.groups if group.id.startswith(wanted)]
    return matching[0] if len(matching) == 1 and wanted else None


# -- a partner's history ------------------------------------------------------------------

def history(store: Any, partner_id: str, limit: int = 100) -> list[Record]:
    """Return seed 002's "Partner Event History": the partner's events, newest first."""
    return list(store.find_events(EventQuery(partner_id=partner_id), limit=limit,
                                  fields=LIST_FIELDS))


# -- one event ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Attempt:
    """One entry of ``resilienceAttemptCount``: its number, time and delay since the previous."""

    number: int
    at: datetime | None
    delay_ms: float | None
    after_replay: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the attempt as plain data."""
        return {"attempt": self.number, "at": self.at, "delay_ms": self.delay_ms,
                "after_replay": self.after_replay}


def replay_boundaries(record: Mapping[str, Any]) -> set[int]:
    """Return the attempt numbers after which an operator replayed the record."""
    found = {entry.get("attempt") for entry in _list(record.get("replays"))
             if isinstance(entry, Mapping)}
    found.add(record.get("replayed_at_attempt"))
    return {number for number in found if isinstance(number, int) and number > 0}


def timeline(record: Mapping[str, Any]) -> list[Attempt]:
    """Return the record's attempts in order, each with the delay since the one before."""
    history_map = lookup(record, "entity_metadata.resilienceAttemptCount")
    entries = history_map if isinstance(history_map, Mapping) else {}
    numbered = sorted((int(number), from_epoch_ms(stamp)) for number, stamp in entries.items()
                      if str(number).isascii() and str(number).isdigit())
    boundaries = replay_boundaries(record)
    attempts: list[Attempt] = []
    previous: datetime | None = None
    for number, at in numbered:
        delay = (at - previous).total_seconds() * 1000 if at and previous else None
        previous = at
        attempts.append(Attempt(number, at, delay, after_replay=number - 1 in boundaries))
    return attempts


@dataclasses.dataclass
class EventView:
    """One record as ``show`` and the console's event page present it."""

    record: Record
    attempts: list[Attempt]
    tree: cascade.Node | None

    @property
    def key(self) -> str:
        """The record's idempotency key."""
        return str(self.record.get("idempotency_key"))

    def to_json(self) -> dict[str, Any]:
        """Return the view as plain data (``show --json``)."""
        return {"record": self.record, "attempts": [a.to_json() for a in self.attempts],
                "cascade": _node_json(self.tree) if self.tree else None}


def event_view(store: Any, key: str) -> EventView | None:
    """Return the record of ``key`` with its timeline and cascade; None when unknown."""
    record = store.get(key)
    if record is None:
        return None
    record.pop("_id", None)
    return EventView(record, timeline(record), cascade.load(store, key))


def _node_json(node: cascade.Node) -> dict[str, Any]:
    return {"key": node.key, "event_type": node.event_type, "status": node.status,
            "error": node.error, "children": [_node_json(child) for child in node.children]}


# -- counts in a window -------------------------------------------------------------------

@dataclasses.dataclass
class Stats:
    """Counts of the events created in a window, by type, by partner, and by status."""

    since: datetime
    by_type: dict[str, Counter[str]]
    by_partner: dict[str, Counter[str]]

    @property
    def statuses(self) -> list[str]:
        """Every status label seen, sorted."""
        seen = {label for counts in self.by_type.values() for label in counts}
        return sorted(seen)

    @property
    def total(self) -> int:
        """How many events the window holds."""
        return sum(sum(counts.values()) for counts in self.by_type.values())

    def to_json(self) -> dict[str, Any]:
        """Return the counts as plain data (``stats --json``)."""
        return {"since": self.since, "total": self.total,
                "by_type": {name: dict(c) for name, c in sorted(self.by_type.items())},
                "by_partner": {name: dict(c) for name, c in sorted(self.by_partner.items())}}


def stats(store: Any, since: datetime) -> Stats:
    """Return the counts of the events created since ``since``."""
    query = EventQuery(since=since)
    names = ["event_type", "entity_metadata.partnerId", "event_status", "retryable"]
    by_type: dict[str, Counter[str]] = defaultdict(Counter)
    by_partner: dict[str, Counter[str]] = defaultdict(Counter)
    for count in store.count_events(query, names):
        event_type, partner, status, retryable = count.values
        label = status_label({"event_status": status, "retryable": retryable})
        by_type[str(event_type)][label] += count.count
        by_partner[str(partner)][label] += count.count
    return Stats(since, dict(by_type), dict(by_partner))


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Events created in one time bucket, and how many of them are FAILED now."""

    start: datetime
    total: int
    failed: int

    @property
    def failure_rate(self) -> float:
        """The share of the bucket's events that are FAILED (0 when empty)."""
        return self.failed / self.total if self.total else 0.0


def throughput(store: Any, now: datetime, hours: int = 24) -> list[Bucket]:
    """Return one bucket per hour of the last ``hours`` hours, oldest first, empty ones too."""
    hour_ms = 3_600_000
    first = int(now.timestamp() * 1000) // hour_ms * hour_ms - (hours - 1) * hour_ms
    since = datetime.fromtimestamp(first / 1000, UTC)
    totals: Counter[int] = Counter()
    failures: Counter[int] = Counter()
    for count in store.count_events(EventQuery(since=since), ["event_status"],
                                    bucket_ms=hour_ms):
        if count.bucket is None:
            continue
        totals[count.bucket] += count.count
        failures[count.bucket] += count.count if count.values[0] == FAILED else 0
    return [Bucket(since + timedelta(hours=n), totals[first + n * hour_ms],
                   failures[first + n * hour_ms]) for n in range(hours)]


def overview_counts(store: Any) -> dict[str, Counter[str]]:
    """Return every stored event counted by type and status label (the console's overview)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for count in store.count_events(EventQuery(), ["event_type", "event_status", "retryable"]):
        event_type, status, retryable = count.values
        label = status_label({"event_status": status, "retryable": retryable})
        counts[str(event_type)][label] += count.count
    return dict(counts)


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def labels(counts: Iterable[Mapping[str, int]]) -> list[str]:
    """Return every status label of ``counts``, in the order the lifecycle goes."""
    order = ["PENDING", "PROCESSING", "SUCCESS", "FAILED(retrying)", "FAILED(final)"]
    seen = {label for row in counts for label in row}
    return [label for label in order if label in seen] + sorted(seen - set(order))


def percentile(values: Sequence[float], share: float) -> float | None:
    """Return the nearest-rank percentile ``share`` (0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(int(-(-share * len(ordered) // 1)), 1)  # ceil, at least the first
    return ordered[min(rank, len(ordered)) - 1]


def forwarded(record: Mapping[str, Any]) -> list[list[str]]:
    """One row per forward to a public topic: topic, contract, state, message id, when or why."""
    rows = []
    for entry in record.get("outbox", []):
        if isinstance(entry, Mapping) and is_forward(entry):
            error = entry.get("error") or entry.get("last_error") or {}
            why = error.get("message", "") if isinstance(error, Mapping) else ""
            at = entry.get("published_at")
            rows.append([safe(entry.get("topic")),
                         safe(f"{entry.get('contract')}@{entry.get('contract_version')}"),
                         safe(entry.get("status")), safe(entry.get("messageId") or ""),
                         safe(why) if why else str(at or "")])
    return rows
