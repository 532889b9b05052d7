"""Parked events and partner documents: the pure rules both stores and the layers above share.

A *parked* event is FAILED-retryable with an ``error`` whose classification
is ``parked``, naming the ``partner`` and the time it is brought back
(``until``, also its ``redrive_at``). The record's top-level ``parks`` counts
its parks so far (``$inc`` by each park's finish); no claim, unclaim or
failure erases it, so a parked claim spends neither an attempt nor a redrive
however its next claim ends.

The partners collection holds two kinds of documents: one breaker per
partner (``_id`` ``breaker/<name>``) and one token bucket per partner with a
rate (``_id`` ``rate/<name>``, deleted by the TTL index on ``expire_at`` once
it is full again). The bucket's rule is ``rate_step`` in Python (the memory
store) and ``rate_pipeline`` on the server (MongoDB): one rule, two forms.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import bson_time
from eventbus.store.documents.parked import PARKED, is_parked, parked_filter, parks

__all__ = ["PARKED", "is_parked", "parked_filter", "parks"]  # parked events: the core's

BREAKER = "breaker"
RATE = "rate"


def breaker_id(name: str) -> str:
    """Return the ``_id`` of partner ``name``'s breaker document."""
    return f"{BREAKER}/{name}"


def breaker_document(name: str, version: int, document: Mapping[str, Any]) -> dict[str, Any]:
    """Return the breaker document stored: ``document`` with its id, kind, name and version."""
    return {**document, "_id": breaker_id(name), "kind": BREAKER, "name": name,
            "version": version}


RATE_KEEP = timedelta(hours=1)
"""How long after its bucket is full again a rate document is kept (then TTL-deleted)."""
_MS = timedelta(milliseconds=1)


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """A shared rate as a token bucket: one token every ``interval_ms``, at most ``burst`` held.

    Over any span of time ``T`` at most ``T / interval + burst`` calls are let
    through, wherever the span starts: there are no windows to straddle.
    """

    interval_ms: int
    """Milliseconds between two tokens (at least 1: the store's grain)."""
    burst: int = 1
    """Tokens the bucket holds: calls let through at once after a quiet spell (at least 1)."""

    def __post_init__(self) -> None:
        if self.interval_ms < 1 or self.burst < 1:
            raise ValueError(f"a rate needs interval_ms >= 1 and burst >= 1, not {self}")

    @classmethod
    def per_second(cls, rate: float, burst_seconds: float = 1.0) -> RateLimit:
        """``rate`` calls per second, with ``burst_seconds``' worth of calls (at least 1) at once.

        The interval is rounded up to the millisecond, so the rate kept is
        never above ``rate`` (and at most 1,000 calls per second); the burst
        holds at most a day's worth of calls.
        """
        if not rate > 0:
            raise ValueError(f"a rate must be positive, not {rate!r}")
        rate = min(rate, 1000.0)
        span = min(burst_seconds, 86_400.0) if burst_seconds > 0 else 0.0
        return cls(max(1, math.ceil(1000 / rate)), max(1, math.floor(rate * span + 1e-9)))

    @property
    def tolerance_ms(self) -> int:
        """How far ahead of now the bucket's next-free time may be and still admit a call."""
        return (self.burst - 1) * self.interval_ms


@dataclasses.dataclass(frozen=True)
class RateTake:
    """What one ``rate_take`` decided, on the store's clock."""

    taken: bool
    """True: a token is this call's, at ``until`` (now, or after a wait of at most the
    caller's ``max_wait``). False: none is free soon enough; nothing was taken."""
    wait: timedelta
    """How long from ``at`` until the call may go: its token (taken), or the next free one."""
    at: datetime
    """The store's time when it decided."""

    @property
    def until(self) -> datetime:
        """When the call may go (taken) or the next token is free (refused): ``at + wait``."""
        return self.at + self.wait


def rate_id(name: str) -> str:
    """Return the ``_id`` of partner ``name``'s token bucket document."""
    return f"{RATE}/{name}"


def rate_step(tat: datetime | None, now: datetime, limit: RateLimit,
              max_wait: timedelta) -> tuple[RateTake, datetime]:
    """Decide one call at ``now`` on a bucket whose next-free time is ``tat``; the new ``tat``.

    Hand-written GCRA (the generic cell rate algorithm, ITU-T I.371), a
    token bucket kept as one time instead of a count and a refill time: the
    *theoretical arrival time* ``tat`` is when the bucket would be full
    again. A call at ``now`` may go at ``max(tat, now) - tolerance``; if
    that is at most ``max_wait`` away it takes the token (``tat`` moves one
    interval on, so later callers queue behind it instead of racing for it),
    else it takes nothing and learns when the next token is free. One
    stored time and no refill job are what let the server decide it inside
    one atomic update on its own clock (``rate_pipeline``); the memory store
    runs this function under its lock. Times are at BSON's millisecond grain
    so both forms agree to the millisecond. ``None``: no bucket yet (full).
    """
    now = bson_time(now)
    base = now if tat is None else max(bson_time(tat), now)
    wait = max(timedelta(0), base - now - limit.tolerance_ms * _MS)
    taken = wait <= max_wait
    after = base + limit.interval_ms * _MS if taken else base
    return RateTake(taken, wait, now), after


def rate_document(name: str, tat: datetime, take: RateTake) -> dict[str, Any]:
    """Return partner ``name``'s bucket document as stored after ``take`` (memory's form)."""
    return {"_id": rate_id(name), "kind": RATE, "name": name, "tat": tat, "at": take.at,
            "wait_ms": take.wait // _MS, "taken": take.taken, "expire_at": tat + RATE_KEEP}


def rate_pipeline(name: str, limit: RateLimit, max_wait: timedelta, now: Any) -> list[Any]:
    """Return ``rate_step`` as an update pipeline, decided on the server's ``now`` expression.

    ``now`` is ``eventbus.clock.store_now(shift)`` (``$$NOW``, one value for
    the whole command). Run with ``find_one_and_update`` on ``{"_id":
    rate_id(name)}``, upserted, returning the document after: its ``taken``,
    ``wait_ms`` and ``at`` are this call's answer (``rate_result``).
    """
    max_wait_ms = max_wait // _MS
    return [
        {"$set": {"at": now}},
        {"$set": {"base": {"$max": [{"$ifNull": ["$tat", "$at"]}, "$at"]}}},
        {"$set": {"wait_ms": {"$max": [0, {"$subtract": [{"$subtract": ["$base", "$at"]},
                                                          limit.tolerance_ms]}]}}},
        {"$set": {"taken": {"$lte": ["$wait_ms", max_wait_ms]}}},
        {"$set": {"tat": {"$cond": ["$taken", {"$add": ["$base", limit.interval_ms]},
                                    "$base"]},
                  "kind": RATE, "name": name}},
        {"$set": {"expire_at": {"$add": ["$tat", RATE_KEEP // _MS]}}},
        {"$unset": "base"},
    ]


def rate_result(document: Mapping[str, Any]) -> RateTake:
    """Read the answer a bucket document holds after ``rate_pipeline`` (or ``rate_document``)."""
    return RateTake(bool(document["taken"]), timedelta(milliseconds=int(document["wait_ms"])),
                    bson_time(document["at"]))
