"""Slow calls: this process's window of a partner's latest calls, and when their share is too slow.

Pure (the standard library only). ``eventbus.partners.call`` keeps one
``CallWindow`` per partner per process and asks ``SlowPolicy.opens`` after
each slow call whether the breaker opens, as resilience4j's count-based
window does (``slowCallDurationThreshold``, ``slowCallRateThreshold``,
``minimumNumberOfCalls``, ``slidingWindowSize``).

**Why per process, not in the shared breaker document.** A shared window
would be a compare-and-swap on one document per partner for **every** call,
by every thread of every instance: today a healthy call writes nothing (one
read), and under load most swaps would be lost and retried. A slow partner is
slow for every caller, so each process's own sample sees it; the decision it
takes (opening) is shared at once through the breaker document, with the
numbers that took it (``reason``), and every slow call is counted there too
(``slow_calls``: one write after a call that already took seconds). The cost:
each process needs ``min_calls`` of its own before its share counts. A
process forgets its window whenever the breaker opens (it sees a new
``opened_at`` on its next call), so the old slow calls of a partner that
recovered do not reopen it.

**A call already slow counts before it answers.** A slow partner's calls are
seen as slow only when they end, so with answers of ``T`` seconds and ``c``
calls allowed at once, ``min_calls`` of them take ``min_calls / c * T`` to end,
while they hold threads. A call still running after ``seconds`` will be slow
whatever it answers, so ``CallWindow.tally_now`` counts it as a slow call
already: the breaker opens a round of answers sooner (``eventbus.partners.call``
asks before every call).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Hashable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Tally:
    """A window's count: its calls, and how many of them were slow."""

    calls: int = 0
    slow: int = 0

    @property
    def share(self) -> float:
        """The slow share (0 with no calls)."""
        return self.slow / self.calls if self.calls else 0.0


@dataclasses.dataclass(frozen=True)
class SlowPolicy:
    """What counts as slow, and what share of how many calls opens the breaker."""

    seconds: float = 0.0
    """A call at least this long is slow; 0: slow calls are not counted."""
    share: float = 0.5
    min_calls: int = 10
    window: int = 20

    @property
    def enabled(self) -> bool:
        """True when slow calls count at all."""
        return self.seconds > 0

    def is_slow(self, seconds: float) -> bool:
        """True when a call of ``seconds`` is slow."""
        return self.enabled and seconds >= self.seconds

    def opens(self, tally: Tally) -> bool:
        """True when ``tally`` (a window that just counted a slow call) opens the breaker."""
        return self.enabled and tally.calls >= self.min_calls \
            and tally.slow >= self.share * tally.calls

    def reason(self, tally: Tally) -> dict[str, Any]:
        """The breaker's ``reason`` when ``tally`` opened it: the numbers, stored as they are."""
        return {"cause": "slow calls", "slow": tally.slow, "calls": tally.calls,
                "share": round(tally.share, 4), "threshold": self.share,
                "slow_seconds": self.seconds}


class CallWindow:
    """This process's latest calls of one partner (slow or not), at most ``size``, and its calls
    still running; thread-safe."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._calls: collections.deque[bool] = collections.deque(maxlen=self._size)
        self._running: dict[int, float] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._epoch: Hashable = None

    def observe(self, epoch: Hashable) -> None:
        """Forget every call when the breaker's opening (``epoch``: its ``opened_at``) changed."""
        with self._lock:
            if epoch != self._epoch:
                self._epoch = epoch
                self._calls.clear()

    def started(self, at: float) -> int:
        """Note a call that started at ``at`` (monotonic seconds); the token ``ended`` takes."""
        with self._lock:
            token = next(self._tokens)
            self._running[token] = at
            return token

    def ended(self, token: int, slow: bool) -> Tally:
        """Count the call of ``token`` (from ``started``), slow or not; the tally with it."""
        with self._lock:
            self._running.pop(token, None)
            self._calls.append(slow)
            return self._tally()

    def dropped(self, token: int) -> None:
        """Forget the call of ``token`` without counting it (it was interrupted)."""
        with self._lock:
            self._running.pop(token, None)

    def tally_now(self, now: float, seconds: float) -> tuple[Tally, int]:
        """The window with each call running for ``seconds`` or more at ``now`` counted as a
        slow call, the newest ones; and how many of those there are."""
        with self._lock:
            running = min(self._size, sum(1 for at in self._running.values()
                                          if now - at >= seconds))
            # The newest ended calls that still fit beside them (all of them in a short window).
            kept = list(self._calls)[max(0, len(self._calls) - (self._size - running)):] \
                if running < self._size else []
            return Tally(len(kept) + running, sum(kept) + running), running

    def _tally(self) -> Tally:
        return Tally(len(self._calls), sum(self._calls))
