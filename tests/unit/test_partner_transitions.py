"""Hypothesis over breaker transitions: never open forever, never called while open.

Any sequence of successes, transient and permanent failures, probes lost
by a dying worker, restarts (a fresh ``Partners`` over the same store) and
clock moves (the store's clock: every breaker time is read from it) is run
against the in-memory store, each instance's own clock ten minutes ahead of
or behind it (which must change nothing). After each step: a call went
through only when the stored breaker let it (closed, or open past its time
with no live probe); at the end, once the longest open time and the probe
time have passed, a call goes through and closes the breaker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eventbus.model.errors import BreakerOpen, PermanentError, RateLimited, TransientError
from eventbus.partners import CLOSED, HALF_OPEN, OPEN, BreakerState, Partners, partner_name
from eventbus.settings import Settings, SettingsError
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from tests.hypothesis_profiles import examples
from tests.partner_stores import beside

SETTINGS = Settings(breaker_failures=2, breaker_open_seconds=5, breaker_open_cap_seconds=12,
                    breaker_probe_seconds=3)
SKEW = dt.timedelta(minutes=10)
# Transient failures weigh most, and clock moves land on the open and probe
# times as often as between them: the sequences that reach a failed probe.
STEPS = st.lists(st.one_of(
    st.sampled_from(["ok", "transient", "transient", "transient", "permanent", "die",
                     "restart"]),
    st.sampled_from([0, 1, 3, 5, 10, 12, 20]), st.integers(min_value=0, max_value=25)),
    max_size=60)


class Died(BaseException):
    """A worker killed during its call: nothing after the call runs."""


def may_call(state: BreakerState, now: dt.datetime) -> bool:
    """The rule: a call goes only through a closed breaker, or one whose wait is over."""
    if state.manual is not None:
        return False
    if state.state == OPEN:
        return state.open_until is not None and now >= state.open_until
    if state.state == HALF_OPEN:
        return state.probe_until is not None and now >= state.probe_until
    return state.state == CLOSED


def attempt(group: Partners, store: MemoryEventStore, clock: FakeClock, step: str) -> None:
    before, called = BreakerState.from_document(beside(store).breaker_get("acme")), []

    def effect() -> None:
        called.append(step)
        if step == "transient":
            raise TransientError("503")
        if step == "permanent":
            raise PermanentError("400")
        if step == "die":
            raise Died()

    with contextlib.suppress(BreakerOpen, TransientError, PermanentError, Died):
        group.get("acme").call(effect)
    assert not called or may_call(before, clock()), (before, clock())


@settings(max_examples=examples(300), deadline=None)
@given(STEPS)
@example(["transient", "transient", 5, "transient", 10, "transient"])  # probes fail: the cap
@example(["transient", "transient", 5, "die", 2, "ok", 1, "ok"])  # a probe lost, then one more
def test_no_sequence_leaves_a_partner_open_forever_or_calls_it_while_open(
        steps: list[str | int]) -> None:
    clock = FakeClock()
    store = MemoryEventStore(clock=clock)  # the breaker's times are the store's
    skews = itertools.cycle([SKEW, -SKEW])

    def instance() -> Partners:
        return Partners.beside(store, SETTINGS, now=FakeClock(clock() + next(skews)),
                        sleep=clock.advance)

    group = instance()
    for step in steps:
        if isinstance(step, int):
            clock.advance(step)
        elif step == "restart":
            group = instance()
        else:
            attempt(group, store, clock, step)
    clock.advance(SETTINGS.breaker_open_cap_seconds + SETTINGS.breaker_probe_seconds)
    assert group.get("acme").call(lambda: "through") == "through"
    assert BreakerState.from_document(beside(store).breaker_get("acme")).state == CLOSED


@given(st.text(max_size=300) | st.binary(max_size=50).map(lambda raw: raw.decode("latin-1")))
def test_any_partner_name_is_one_safe_key(name: str) -> None:
    stored = partner_name(name)
    assert 0 < len(stored) <= 100 and stored.isprintable()
    stored.encode("utf-8")  # no lone surrogate reaches the store
    assert partner_name(name) == stored


def test_hostile_names_hash_and_different_names_stay_apart() -> None:
    hostile = ["", "a\x00b", "\ud800", "x" * 10_000, " acme", "sha256:abc", "a\nb"]
    stored = [partner_name(name) for name in hostile]
    assert all(name.startswith("sha256:") for name in stored)
    assert len(set(stored)) == len(hostile) and partner_name("acme") == "acme"


@given(st.text(max_size=300))
def test_the_call_path_stores_a_breaker_and_parks_under_one_normalisation(name: str) -> None:
    # The name was normalised by Partners.get and again by Partner: a hashed name
    # (anything unusual) opened its breaker under the hash of its hash.
    store = MemoryEventStore(clock=FakeClock(dt.datetime(2026, 11, 22, tzinfo=dt.UTC)))
    group = Partners.beside(store, SETTINGS)
    for _ in range(SETTINGS.breaker_failures):
        with contextlib.suppress(TransientError, BreakerOpen):
            group.get(name).call(_down)
    assert group.get(name).name == partner_name(name)
    assert [doc["name"] for doc in beside(store).breakers()] == [partner_name(name)]
    with contextlib.suppress(BreakerOpen):
        group.get(name).call(_down)
        raise AssertionError("the open breaker let a call through")


def test_a_partners_own_rate_is_found_under_its_stored_name() -> None:
    rates = Partners.beside(MemoryEventStore(), Settings(partner_rate=5.0,
                                                  partner_rates=(("a\x00b", 0.5),)))
    assert rates.rate(rates.get("a\x00b").name) == 0.5 and rates.rate("other") == 5.0


def _down() -> None:
    raise TransientError("503")


def test_a_rate_of_zero_means_no_limit_globally_and_per_partner() -> None:
    # EVENTBUS_PARTNER_RATE=0 stopped start-up ("must be positive") though documented
    # as no limit; a partner's own 0 lifts the global rate for that partner alone.
    settings = Settings.from_env({"EVENTBUS_PARTNER_RATE": "0"})
    assert settings.partner_rate == 0.0
    settings = Settings.from_env({"EVENTBUS_PARTNER_RATE": "1",
                                  "EVENTBUS_PARTNER_RATES": "free=0,slow=0.5",
                                  "EVENTBUS_PARTNER_RATE_WAIT_SECONDS": "0.001"})
    assert settings.partner_rates == (("free", 0.0), ("slow", 0.5))
    clock = FakeClock(dt.datetime(2026, 11, 22, tzinfo=dt.UTC))
    group = Partners.beside(MemoryEventStore(clock=clock), settings, now=clock)
    assert [group.get("free").call(lambda n=n: n) for n in range(50)] == list(range(50))
    group.get("other").call(lambda: None)
    with pytest.raises(RateLimited):  # the global rate still holds for the others
        group.get("other").call(lambda: None)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_a_rate_that_is_not_a_number_of_calls_is_refused_at_start_up(value: str) -> None:
    for variable, text in (("EVENTBUS_PARTNER_RATE", value),
                           ("EVENTBUS_PARTNER_RATES", f"acme={value}")):
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env({variable: text})
