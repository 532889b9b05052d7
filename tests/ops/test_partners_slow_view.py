"""Why a breaker opened, its slow calls and the bulkhead, in ``eventbus partners`` and the console.

On the real server. Slow calls are timed on an injected monotonic clock the
fake partner moves; nothing sleeps. Calls in flight are each process's own:
the command (and a console of its own) say so instead of showing 0; the
console mounted in the service shows its process's.
"""

from __future__ import annotations

import datetime as dt

import pytest
from flask.testing import FlaskClient

from eventbus.model.errors import TransientError
from eventbus.partners import Partners
from eventbus.partners import view as partner_view
from eventbus.settings import Settings
from tests.ops.conftest import Bus
from tests.ops.test_console import get, signed_in
from tests.partner_stores import beside

SLOW = {"breaker_slow_seconds": 2.0, "breaker_slow_share": 0.5, "breaker_slow_min_calls": 4,
        "breaker_slow_window": 4}


def slow_partner(bus: Bus, name: str = "acme") -> Partners:
    """Four calls, three of them 8 s long: the breaker opens on slow calls."""
    ticks = [0.0]
    group = Partners.beside(bus.store, Settings(**SLOW), monotonic=lambda: ticks[0])
    for seconds in (0.1, 8.0, 8.0, 8.0):
        def effect(seconds: float = seconds) -> None:
            ticks[0] += seconds
        group.get(name).call(effect)
    return group


def test_the_command_shows_the_slow_calls_that_opened_a_breaker_with_the_numbers(
        bus: Bus) -> None:
    slow_partner(bus)
    code, out, _ = bus.run("partners", "--wide")  # the reason whole: tables cut at 100
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("acme"))
    assert "slow calls: 3 of the last 4 took >= 2.0 s (75%, threshold 50%)" in row
    assert "3 (last 8 s at" in row
    assert "calls in flight are each process's own" in out
    [acme] = bus.json("partners")
    assert acme["state"] == "open" and acme["slow_calls"] == 3
    assert acme["reason"].startswith("slow calls: 3 of the last 4")
    assert acme["in_flight"] is None  # not this process's to know


def test_the_command_shows_failures_as_the_reason_and_the_bulkhead_cap(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTBUS_PARTNER_CONCURRENCIES", "globex=3")
    group = Partners.beside(bus.store, bus.settings)

    def down() -> None:
        raise TransientError("503")

    for _ in range(bus.settings.breaker_failures):
        with pytest.raises(TransientError):
            group.get("acme").call(down)
    rows = {view["name"]: view for view in bus.json("partners")}
    assert rows["acme"]["reason"] == "5 failures in a row (threshold 5)"
    assert (rows["globex"]["concurrency"], rows["globex"]["state"]) == (3, "closed")
    assert rows["acme"]["concurrency"] == 0


def test_the_console_shows_the_reason_and_says_whose_calls_in_flight(bus: Bus) -> None:
    slow_partner(bus)
    page = get(signed_in(bus), "/partners").get_data(as_text=True)
    assert "slow calls: 3 of the last 4 took &gt;= 2.0 s (75%, threshold 50%)" in page
    assert "in flight (this process)" in page
    assert "this console runs in none of the service" in page
    assert '<td class="in-flight">-</td>' in page


def test_the_console_mounted_in_the_service_shows_its_process_calls_in_flight(
        bus: Bus) -> None:
    group = slow_partner(bus)
    browser: FlaskClient = signed_in(bus)
    browser.application.extensions["eventbus.console"].partners = group
    with group.slot("acme"), group.slot("acme"):
        page = get(browser, "/partners").get_data(as_text=True)
    assert '<td class="in-flight">2</td>' in page
    assert "<strong>this process's</strong>" in page
    views = partner_view.views(beside(bus.store), bus.settings, dt.datetime.now(dt.UTC), group)
    assert [(v.name, v.in_flight) for v in views] == [("acme", 0)]
