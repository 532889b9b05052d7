"""Slow calls open a partner's breaker, on both stores; nothing sleeps.

A call's length is this process's monotonic clock, injected: ``Ticker``,
which the fake partner moves by the seconds it "takes". The breaker's times
are the store's clock (the memory store's ``FakeClock``, the server's moved
by a ``Shift``), moved by hand. The window of recent calls is each process's
(``eventbus.partners.slow_calls``); the opening, its reason and the slow-call count
are shared through the stored breaker, so a second instance sees them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from eventbus.model.errors import BreakerOpen, TransientError
from eventbus.partners import CLOSED, HALF_OPEN, OPEN, Partners
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from tests.contract.conftest import StoreClock
from tests.partner_stores import beside

SLOW = Settings(breaker_failures=3, breaker_open_seconds=30, breaker_open_cap_seconds=100,
                breaker_probe_seconds=10, breaker_slow_seconds=2.0, breaker_slow_share=0.5,
                breaker_slow_min_calls=4, breaker_slow_window=4)


class Ticker:
    """This process's monotonic clock: moved only by the calls that "take" time."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds


def group(store: EventStore, settings: Settings = SLOW) -> tuple[Partners, Ticker]:
    ticker = Ticker()
    return Partners.beside(store, settings, monotonic=ticker, sleep=lambda _: None), ticker


def taking(ticker: Ticker, seconds: float, fail: bool = False) -> Callable[[], str]:
    def effect() -> str:
        ticker.seconds += seconds
        if fail:
            raise TransientError("partner answered 504 after a while")
        return "answered"
    return effect


def breaker(store: EventStore, name: str = "acme") -> dict[str, Any]:
    found = beside(store).breaker_get(name)
    assert found is not None
    return found


def test_slow_calls_at_the_share_open_the_breaker_with_the_numbers(
        store: EventStore, store_clock: StoreClock) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    assert acme.call(taking(ticker, 0.1)) == "answered"
    assert acme.call(taking(ticker, 0.2)) == "answered"
    assert beside(store).breaker_get("acme") is None  # fast answers on a closed breaker: no write
    assert acme.call(taking(ticker, 2.5)) == "answered"  # slow, 1 of 3: counted, not open
    assert (breaker(store)["state"], breaker(store)["slow_calls"]) == (CLOSED, 1)
    # The fourth call is slow too: 2 of 4 (the minimum) is the 50% share. It answered,
    # so it returns; the breaker opens for the calls after it.
    assert acme.call(taking(ticker, 8.0)) == "answered"
    stored = breaker(store)
    assert stored["state"] == OPEN and stored["slow_calls"] == 2
    assert stored["last_slow_seconds"] == 8.0
    assert stored["reason"] == {"cause": "slow calls", "slow": 2, "calls": 4, "share": 0.5,
                                "threshold": 0.5, "slow_seconds": 2.0}
    assert stored["failures"] == 0
    with pytest.raises(BreakerOpen):
        acme.call(lambda: pytest.fail("called while open"))
    # Another instance, with a window of its own, sees the same breaker open.
    other, _ = group(store)
    with pytest.raises(BreakerOpen):
        other.get("acme").call(lambda: pytest.fail("called while open"))


def test_fewer_calls_than_the_minimum_or_a_smaller_share_never_open_it(
        store: EventStore) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    for _ in range(3):  # all slow, but only three calls: under the minimum of four
        acme.call(taking(ticker, 5))
    assert breaker(store)["state"] == CLOSED
    globex = partners.get("globex")
    for seconds in (5, 0.1, 0.1, 0.1, 5, 0.1, 0.1):  # at most 1 in 4 slow
        globex.call(taking(ticker, seconds))
    assert (breaker(store, "globex")["state"], breaker(store, "globex")["slow_calls"]) \
        == (CLOSED, 2)


def test_a_slow_probe_reopens_it_for_longer_and_a_fast_one_closes_it(
        store: EventStore, store_clock: StoreClock) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    for _ in range(4):
        acme.call(taking(ticker, 3))
    assert breaker(store)["state"] == OPEN and breaker(store)["open_seconds"] == 30
    store_clock.advance(31)
    assert acme.call(taking(ticker, 9)) == "answered"  # the probe: answered, slowly
    stored = breaker(store)
    assert (stored["state"], stored["open_seconds"]) == (OPEN, 60)
    assert stored["reason"] == {"cause": "slow probe", "seconds": 9.0, "slow_seconds": 2.0}
    store_clock.advance(61)
    assert acme.call(taking(ticker, 0.1)) == "answered"
    stored = breaker(store)
    assert (stored["state"], stored["slow_calls"]) == (CLOSED, 0)
    assert stored["reason"]["cause"] == "slow probe"  # why it last opened, kept
    # The window was forgotten when the breaker opened: one slow call now is 1 of 2.
    acme.call(taking(ticker, 3))
    assert breaker(store)["state"] == CLOSED


def test_slow_failures_count_as_failures_and_as_slow(store: EventStore) -> None:
    partners, ticker = group(store, Settings(**{**SLOW.__dict__, "breaker_failures": 10}))
    acme = partners.get("acme")
    acme.call(taking(ticker, 0.1))
    acme.call(taking(ticker, 0.1))
    with pytest.raises(TransientError):
        acme.call(taking(ticker, 4, fail=True))
    # The slow failure that makes the share opens it, and its event is parked with the rest.
    with pytest.raises(BreakerOpen) as opened:
        acme.call(taking(ticker, 4, fail=True))
    assert isinstance(opened.value.__cause__, TransientError)
    stored = breaker(store)
    assert (stored["state"], stored["failures"], stored["slow_calls"]) == (OPEN, 2, 2)
    assert stored["reason"]["cause"] == "slow calls"


def test_failures_record_their_reason(store: EventStore) -> None:
    partners, ticker = group(store)
    for _ in range(2):
        with pytest.raises(TransientError):
            partners.get("acme").call(taking(ticker, 0.1, fail=True))
    with pytest.raises(BreakerOpen):
        partners.get("acme").call(taking(ticker, 0.1, fail=True))
    assert breaker(store)["reason"] == {"cause": "failures", "failures": 3, "threshold": 3}


def test_slow_calls_are_not_counted_when_the_setting_is_off(store: EventStore) -> None:
    partners, ticker = group(store, Settings(breaker_failures=3))
    for _ in range(20):
        partners.get("acme").call(taking(ticker, 600))
    assert beside(store).breaker_get("acme") is None


def test_a_probe_taken_stays_half_open_while_it_is_slow_elsewhere(
        store: EventStore, store_clock: StoreClock) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    for _ in range(4):
        acme.call(taking(ticker, 3))
    store_clock.advance(31)
    seen: list[str] = []

    def probe() -> str:
        seen.append(breaker(store)["state"])
        other, _ = group(store)
        with pytest.raises(BreakerOpen):  # the probe is out: nobody else goes
            other.get("acme").call(lambda: pytest.fail("second probe"))
        ticker.seconds += 0.5
        return "answered"

    assert acme.call(probe) == "answered"
    assert seen == [HALF_OPEN] and breaker(store)["state"] == CLOSED
    assert breaker(store)["open_until"] is None
    assert timedelta(0) <= store.now() - breaker(store)["opened_at"] < timedelta(seconds=60)


def running_calls(partners: Partners, count: int) -> tuple[list[threading.Thread], threading.Event,
                                                          list[str]]:
    """``count`` calls of acme that run until the returned event is set; their answers."""
    release, answers = threading.Event(), []

    def effect() -> str:
        release.wait(10)
        return "answered"

    threads = [threading.Thread(target=lambda: answers.append(partners.get("acme").call(effect)))
               for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, release, answers


def wait_running(partners: Partners, count: int) -> None:
    window = partners.window("acme")
    deadline = time.monotonic() + 10
    while window.tally_now(float("inf"), 0.0)[1] < count:
        assert time.monotonic() < deadline, "the calls never started"
        time.sleep(0.005)


def test_calls_still_running_past_the_slow_time_open_it_before_they_answer(
        store: EventStore) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    acme.call(taking(ticker, 0.1))
    acme.call(taking(ticker, 0.1))
    threads, release, answers = running_calls(partners, 2)
    try:
        wait_running(partners, 2)
        ticker.seconds += 1.0  # running for 1 s: not slow yet, the next call goes
        assert acme.call(taking(ticker, 0.0)) == "answered"
        ticker.seconds += 1.5  # 2.5 s: both slow though neither answered; with the 2 fast
        # calls before them, 2 of the latest 4 (the minimum) are slow: the share.
        with pytest.raises(BreakerOpen) as refused:
            acme.call(lambda: pytest.fail("called while the running calls are slow"))
        assert refused.value.why == "opened: calls running are slow"
        stored = breaker(store)
        assert stored["state"] == OPEN and stored["slow_calls"] == 0  # none has ended
        assert stored["reason"] == {"cause": "slow calls", "slow": 2, "calls": 4, "share": 0.5,
                                    "threshold": 0.5, "slow_seconds": 2.0, "running": 2}
        # Another instance (a window of its own) sees it open at once.
        other, _ = group(store)
        with pytest.raises(BreakerOpen):
            other.get("acme").call(lambda: pytest.fail("called while open"))
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    # They answered: their events succeed, and each counts as a slow call of the open breaker.
    assert answers == ["answered", "answered"]
    stored = breaker(store)
    assert (stored["state"], stored["slow_calls"]) == (OPEN, 2)


def test_running_calls_under_the_share_or_the_minimum_open_nothing(store: EventStore) -> None:
    partners, ticker = group(store)
    acme = partners.get("acme")
    for _ in range(3):
        acme.call(taking(ticker, 0.1))
    threads, release, _ = running_calls(partners, 1)
    try:
        wait_running(partners, 1)
        ticker.seconds += 30  # one slow running call among 3 fast ones: 1 of 4, under 50%
        assert acme.call(taking(ticker, 0.1)) == "answered"
        assert beside(store).breaker_get("acme") is None
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    fresh, ticker = group(store)  # a new process: 2 running calls, under the minimum of 4
    threads, release, _ = running_calls(fresh, 2)
    try:
        wait_running(fresh, 2)
        ticker.seconds += 30
        assert fresh.get("acme").call(taking(ticker, 0.1)) == "answered"
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    assert breaker(store)["state"] == CLOSED
