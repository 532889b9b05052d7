"""Hypothesis over the shared rate's rule (``documents.partner_documents.rate_step``, GCRA).

Any limit, longest wait and sequence of call times: no span of any length,
starting anywhere, admits more than ``span / interval + burst`` calls; a
call that takes a token goes within the longest wait; a refused call takes
nothing and its ``until`` is exactly when the next call would be let through.
The same rule runs on the server as an update pipeline; the contract suite
(``tests/contract/test_partner_contract.py``) checks that both agree.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from eventbus.partners.documents import RateLimit, RateTake, rate_step

START = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
MS = dt.timedelta(milliseconds=1)
LIMITS = st.builds(RateLimit, st.integers(min_value=1, max_value=3000),
                   st.integers(min_value=1, max_value=6))
WAITS = st.integers(min_value=0, max_value=4000).map(lambda ms: ms * MS)
GAPS = st.lists(st.sampled_from([0, 0, 0, 1, 250, 499, 500, 501, 999, 1000, 3000])
                | st.integers(min_value=0, max_value=5000), min_size=1, max_size=80)


def run(limit: RateLimit, longest: dt.timedelta,
        gaps: list[int]) -> list[tuple[RateTake, dt.datetime | None]]:
    """Each call's decision and the bucket's time before it."""
    now, tat, seen = START, None, []
    for gap in gaps:
        now += gap * MS
        take, after = rate_step(tat, now, limit, longest)
        seen.append((take, tat))
        tat = after
    return seen


@given(LIMITS, WAITS, GAPS)
@example(RateLimit(500, 2), dt.timedelta(0), [990, 0, 0, 0, 20, 0, 0, 0])  # across a second
def test_no_span_admits_more_than_its_share_plus_the_burst(
        limit: RateLimit, longest: dt.timedelta, gaps: list[int]) -> None:
    times = sorted(take.until for take, _ in run(limit, longest, gaps) if take.taken)
    for first in range(len(times)):
        for last in range(first, len(times)):
            span = (times[last] - times[first]) / MS
            assert last - first + 1 <= span / limit.interval_ms + limit.burst


@given(LIMITS, WAITS, GAPS)
def test_a_taken_call_goes_within_the_longest_wait_and_a_refused_one_learns_the_next_token(
        limit: RateLimit, longest: dt.timedelta, gaps: list[int]) -> None:
    for take, tat in run(limit, longest, gaps):
        assert take.wait >= dt.timedelta(0) and take.until == take.at + take.wait
        if take.taken:
            assert take.wait <= longest
            continue
        assert take.wait > longest
        assert rate_step(tat, take.until, limit, dt.timedelta(0))[0].taken
        assert not rate_step(tat, take.until - MS, limit, dt.timedelta(0))[0].taken
        assert rate_step(tat, take.at, limit, longest)[1] == tat  # nothing was taken


def test_a_quiet_bucket_lets_the_burst_through_at_once_then_one_per_interval() -> None:
    seen = run(RateLimit(500, 3), dt.timedelta(0), [0] * 5 + [499, 1])
    assert [take.taken for take, _ in seen] == [True, True, True, False, False, False, True]
    assert [take.wait / MS for take, _ in seen[3:6]] == [500, 500, 1]


@pytest.mark.parametrize(("rate", "burst_seconds", "interval_ms", "burst"), [
    (2, 1, 500, 2), (0.25, 1, 4000, 1), (3, 1, 334, 3), (0.1, 30, 10_000, 3),
    (5000, 1, 1, 1000), (float("inf"), 1, 1, 1000), (1, 0, 1000, 1),
    (1, float("inf"), 1000, 86_400),
])
def test_a_rate_per_second_never_exceeds_the_rate_and_holds_at_least_one_call(
        rate: float, burst_seconds: float, interval_ms: int, burst: int) -> None:
    assert RateLimit.per_second(rate, burst_seconds) == RateLimit(interval_ms, burst)


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_no_rate_is_not_a_limit(rate: float) -> None:
    with pytest.raises(ValueError):
        RateLimit.per_second(rate)
    with pytest.raises(ValueError):
        RateLimit(0, 1)
