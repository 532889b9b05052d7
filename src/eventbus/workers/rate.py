"""An events-per-second ceiling for rate-limited partners, on an injected clock.

A token bucket that holds at most one second of events (``burst``: as many
as given; 1 spaces calls evenly, as replays want): ``wait(n)`` sleeps until
``n`` more events fit under the rate. Small and clock-injected so tests
control time without sleeping; the subscriber's flow control bounds what is
outstanding, this bounds what is processed per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimit:
    """At most ``per_second`` events per second on average (None: no limit)."""

    def __init__(self, per_second: float | None, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 burst: float | None = None) -> None:
        if per_second is not None and per_second <= 0:
            raise ValueError("the rate must be a positive number of events per second")
        self.per_second = per_second
        self.burst = float(burst if burst is not None else per_second or 0)
        """The most events that may run at once after an idle spell."""
        self._monotonic, self._sleep = monotonic, sleep
        self._allowance = self.burst
        self._last = monotonic()

    def wait(self, events: int = 1) -> float:
        """Block until ``events`` more may run; return the seconds slept."""
        if self.per_second is None or events <= 0:
            return 0.0
        self._refill()
        self._allowance -= events
        if self._allowance >= 0:
            return 0.0
        delay = -self._allowance / self.per_second
        self._sleep(delay)
        self._refill()
        return delay

    def _refill(self) -> None:
        assert self.per_second is not None
        now = self._monotonic()
        self._allowance = min(self._allowance + (now - self._last) * self.per_second,
                              self.burst)
        self._last = now
