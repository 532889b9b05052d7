"""Backoff analysis from the stored attempt histories: ``eventbus retries``.

Seed 002 keeps ``resilienceAttemptCount`` so that "exponential backoff
analysis and retry limiting" are possible. Per attempt number this gives
the percentiles of the delay since the previous attempt, next to the
subscription's retry policy (read from Pub/Sub when it answers, else from
flags), and the unfinished events closest to the attempt cap
(``EVENTBUS_MAX_ATTEMPTS``).

Attempts are numbered per run: after a replay (a new Pub/Sub message, whose
backoff starts over) the next attempt is number 1 again, and the delay
across the replay is the operator's, not the broker's, so it is left out.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from eventbus.model.status import Status
from eventbus.ops.reports import percentile, replay_boundaries, timeline
from eventbus.store.base import Record
from eventbus.store.operator_queries import EventQuery

HISTORY_FIELDS = ("idempotency_key", "event_type", "event_status", "retryable", "attempts",
                  "replayed_at_attempt", "replays", "entity_metadata", "created")
SHARES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SCAN = 5_000
UNFINISHED = (Status.PENDING.value, Status.PROCESSING.value, Status.FAILED.value)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A subscription's retry policy, and where it was read from."""

    min_backoff: float | None
    max_backoff: float | None
    source: str

    def to_json(self) -> dict[str, Any]:
        """Return the policy as plain data."""
        return {"min_backoff_s": self.min_backoff, "max_backoff_s": self.max_backoff,
                "source": self.source}


@dataclasses.dataclass(frozen=True)
class AttemptDelays:
    """The observed delays before attempt ``number`` (since attempt ``number - 1``)."""

    number: int
    delays_ms: tuple[float, ...]

    def percentiles(self) -> dict[str, float | None]:
        """Return p50, p90 and p99 of the delays, in milliseconds."""
        return {name: percentile(self.delays_ms, share) for name, share in SHARES}

    def to_json(self) -> dict[str, Any]:
        """Return the row as plain data."""
        return {"attempt": self.number, "samples": len(self.delays_ms), **self.percentiles(),
                "max": max(self.delays_ms) if self.delays_ms else None}


@dataclasses.dataclass(frozen=True)
class NearCap:
    """An unfinished event and how many attempts it has left before the cap."""

    key: str
    event_type: str
    status: str
    used: int
    left: int

    def to_json(self) -> dict[str, Any]:
        """Return the row as plain data."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RetryReport:
    """The backoff analysis: delays per attempt, the policy, the events nearest the cap."""

    rows: list[AttemptDelays]
    policy: Policy
    cap: int
    nearest: list[NearCap]
    scanned: int

    def to_json(self) -> dict[str, Any]:
        """Return the report as plain data (``retries --json``)."""
        return {"policy": self.policy.to_json(), "attempt_cap": self.cap,
                "scanned": self.scanned, "attempts": [row.to_json() for row in self.rows],
                "nearest_cap": [row.to_json() for row in self.nearest]}


def run_numbers(record: Mapping[str, Any]) -> dict[int, int]:
    """Map each stored attempt number to its number within its run (1 after each replay)."""
    boundaries = sorted(replay_boundaries(record))
    numbers = {}
    for attempt in timeline(record):
        start = max((b for b in boundaries if b < attempt.number), default=0)
        numbers[attempt.number] = attempt.number - start
    return numbers


def delays(records: list[Record]) -> list[AttemptDelays]:
    """Return the delays before each attempt number (2 and up) over ``records``."""
    found: dict[int, list[float]] = defaultdict(list)
    for record in records:
        numbers = run_numbers(record)
        for attempt in timeline(record):
            if attempt.delay_ms is not None and not attempt.after_replay:
                found[numbers[attempt.number]].append(attempt.delay_ms)
    return [AttemptDelays(number, tuple(found[number])) for number in sorted(found)]


def used_attempts(record: Mapping[str, Any]) -> int:
    """Return the attempts that count against the cap: those since the last replay."""
    attempts = record.get("attempts")
    taken = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0
    replayed = record.get("replayed_at_attempt")
    start = replayed if isinstance(replayed, int) and not isinstance(replayed, bool) else 0
    return max(taken - start, 0)


def nearest_cap(store: Any, cap: int, count: int = 10) -> list[NearCap]:
    """Return the ``count`` unfinished events with the fewest attempts left."""
    query = EventQuery(statuses=UNFINISHED, min_attempts=1)
    candidates = store.find_events(query, limit=max(count * 20, 200), fields=HISTORY_FIELDS,
                                   order="attempts")
    rows = [NearCap(str(r.get("idempotency_key")), str(r.get("event_type", "?")),
                    str(r.get("event_status")), used_attempts(r), cap - used_attempts(r))
            for r in candidates
            if not (r.get("event_status") == Status.FAILED and r.get("retryable") is not True)]
    return sorted(rows, key=lambda row: (row.left, row.key))[:count]


def analyse(store: Any, policy: Policy, cap: int, *, scan: int = SCAN,
            nearest: int = 10) -> RetryReport:
    """Return the backoff analysis of the (up to ``scan``) newest events retried at least once."""
    records = store.find_events(EventQuery(min_attempts=2), limit=scan, fields=HISTORY_FIELDS)
    return RetryReport(delays(records), policy, cap, nearest_cap(store, cap, nearest),
                       len(records))


def subscription_policy(project: str, subscription: str, timeout: float = 5.0) -> Policy:
    """Read the retry policy of ``subscription`` from Pub/Sub (the emulator when it is set).

    Raises whatever the client raises when Pub/Sub cannot be reached.
    """
    from google.cloud import pubsub_v1

    client = pubsub_v1.SubscriberClient()
    try:
        path = client.subscription_path(project, subscription)
        found = client.get_subscription(request={"subscription": path}, timeout=timeout)
    finally:
        client.close()
    retry = found.retry_policy
    if not retry or (not retry.minimum_backoff and not retry.maximum_backoff):
        return Policy(None, None, f"{subscription}: no retry policy (immediate redelivery)")
    return Policy(_seconds(retry.minimum_backoff), _seconds(retry.maximum_backoff),
                  f"subscription {subscription}")


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if value is None:
        return None
    return float(getattr(value, "seconds", 0)) + getattr(value, "nanos", 0) / 1e9
