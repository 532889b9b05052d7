"""One clock type (issue 41): ``eventbus.clock.Now`` for the time, ``Clock`` for a whole clock."""

from __future__ import annotations

import subprocess

from eventbus import clock
from eventbus.partners import Partners
from eventbus.processor import pipeline
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.telemetry import core
from eventbus.testing import FakeClock


def test_the_fake_and_the_system_clocks_are_whole_clocks() -> None:
    assert isinstance(FakeClock(), clock.Clock) and isinstance(clock.SystemClock(), clock.Clock)
    assert not isinstance(clock.utcnow, clock.Clock)  # a bare now has no waits of its own


def test_partners_wait_and_time_on_a_whole_clock_and_else_on_the_system_one() -> None:
    fake = FakeClock()
    on_fake = Partners.beside(MemoryEventStore(clock=fake), Settings(), now=fake)
    before = fake()
    on_fake.sleep(30)
    assert (fake() - before).total_seconds() == 30 and on_fake.monotonic() == fake.monotonic()
    on_store = Partners.beside(MemoryEventStore(), Settings(), now=clock.utcnow)
    assert on_store.monotonic.__self__.__class__ is clock.SystemClock  # type: ignore[attr-defined]


def test_the_time_has_one_type_under_every_name() -> None:
    assert core.Clock is clock.Now
    assert pipeline.Clock is clock.Now


def test_the_library_writes_no_clock_type_of_its_own() -> None:
    found = subprocess.run(["git", "grep", "-n", "-E", r"= Callable\[\[\], (dt\.)?datetime\]",
                            "--", "src/eventbus"], capture_output=True, text=True, check=False)
    assert [line for line in found.stdout.splitlines()
            if not line.startswith("src/eventbus/clock.py")] == []
