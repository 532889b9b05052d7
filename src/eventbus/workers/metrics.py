"""The pull worker's own figures, beside the per-event ones telemetry records.

``WorkerMetrics`` is a processor ``Middleware``: it times each batch's claim
and finish stages (the store's round trips) and keeps the last batch's
figures for the worker's log line. On the service's OpenTelemetry meter
(``OtelTelemetry.meter``; None when metrics are off, then nothing is
recorded): batch size, the claim's and the finish's latency, and acks an
exactly-once subscription refused. Public OpenTelemetry API only
(``Meter.create_histogram`` / ``create_counter``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

from eventbus.processor import Item, Middleware


@dataclasses.dataclass
class BatchStats:
    """One batch's figures, for the log line and the bench."""

    size: int = 0
    claim_seconds: float = 0.0
    finish_seconds: float = 0.0


class WorkerMetrics(Middleware):
    """Batch figures on ``meter`` (an OpenTelemetry ``Meter``), or only ``last`` without one."""

    def __init__(self, meter: Any | None) -> None:
        self.on = meter is not None
        self.last = BatchStats()
        if meter is None:
            return
        self.size = meter.create_histogram("eventbus.worker.batch.size", "{message}",
                                           "Messages per pulled batch")
        self.claim = meter.create_histogram("eventbus.worker.claim.duration", "s",
                                            "One batch's claim round trip")
        self.finish = meter.create_histogram("eventbus.worker.finish.duration", "s",
                                             "One batch's finish round trip")
        self.failed_acks = meter.create_counter("eventbus.worker.ack.failures", "{ack}",
                                                "Acks an exactly-once subscription refused")

    @contextlib.contextmanager
    def batch(self, items: Sequence[Item]) -> Iterator[None]:
        """Start the batch's figures; record them when it ends."""
        self.last = BatchStats(size=len(items))
        yield
        if self.on:
            self.size.record(self.last.size)
            self.claim.record(self.last.claim_seconds)
            self.finish.record(self.last.finish_seconds)

    @contextlib.contextmanager
    def stage(self, name: str, items: Sequence[Item]) -> Iterator[None]:
        """Time the claim and the finish round trips."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if name == "claim":
                self.last.claim_seconds += time.perf_counter() - started
            elif name == "finish":
                self.last.finish_seconds += time.perf_counter() - started

    def failed_ack(self) -> None:
        """Count one refused ack."""
        if self.on:
            self.failed_acks.add(1)
