"""``eventbus.partners.slow_calls.CallWindow``: ended calls and calls still running, one window."""

from __future__ import annotations

from eventbus.partners.slow_calls import CallWindow, Tally


def test_running_calls_past_the_time_count_as_the_newest_slow_calls() -> None:
    window = CallWindow(4)
    for slow in (False, False, True):
        window.ended(window.started(0.0), slow)
    old, young = window.started(10.0), window.started(14.0)
    # At 13 s only the call started at 10 has run 3 s: it pushes the oldest ended call out.
    assert window.tally_now(13.0, 3.0) == (Tally(4, 2), 1)
    assert window.tally_now(20.0, 3.0) == (Tally(4, 3), 2)  # both slow: two oldest out
    assert window.ended(old, True) == Tally(4, 2)  # ended: counted once, no longer running
    window.dropped(young)
    assert window.tally_now(99.0, 3.0) == (Tally(4, 2), 0)


def test_a_window_not_yet_full_keeps_every_ended_call_beside_the_running_ones() -> None:
    window = CallWindow(4)
    for _ in range(2):
        window.ended(window.started(0.0), False)
    window.started(0.0)
    assert window.tally_now(5.0, 1.0) == (Tally(3, 1), 1)


def test_more_running_calls_than_the_window_fill_it() -> None:
    window = CallWindow(2)
    window.ended(window.started(0.0), False)
    for _ in range(3):
        window.started(0.0)
    assert window.tally_now(5.0, 1.0) == (Tally(2, 2), 2)


def test_a_new_opening_forgets_ended_calls_but_not_running_ones() -> None:
    window = CallWindow(4)
    window.ended(window.started(0.0), True)
    window.started(0.0)
    window.observe("opened-1")
    assert window.tally_now(5.0, 1.0) == (Tally(1, 1), 1)
