"""The pull worker's own instruments, beside the per-event ones the processor records.

On the service's OpenTelemetry meter (``Telemetry.meter``, None when metrics
are off, then nothing is recorded): batch size, the claim's and the finish's
round-trip latency, and acks an exactly-once subscription refused. Public
OpenTelemetry API only (``Meter.create_histogram`` / ``create_counter``).
"""

from __future__ import annotations

from typing import Any


class WorkerMetrics:
    """Batch figures on ``meter`` (an OpenTelemetry ``Meter``), or nothing without one."""

    def __init__(self, meter: Any | None) -> None:
        self.on = meter is not None
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

    def batch(self, size: int, claim_seconds: float, finish_seconds: float) -> None:
        """Record one batch."""
        if self.on:
            self.size.record(size)
            self.claim.record(claim_seconds)
            self.finish.record(finish_seconds)

    def failed_ack(self) -> None:
        """Count one refused ack."""
        if self.on:
            self.failed_acks.add(1)
