"""The bulkhead and slow-call settings, read from hostile environments: refused by name, never
taken as something else (nan passes every "<= 0" test; inf turns a wait into a hang)."""

from __future__ import annotations

import pytest

from eventbus.partners import Partners, Policy
from eventbus.settings import MAX_CONCURRENCY, Settings, SettingsError
from eventbus.store.memory import MemoryEventStore


@pytest.mark.parametrize(("variable", "value"), [
    ("EVENTBUS_PARTNER_CONCURRENCY", "-1"), ("EVENTBUS_PARTNER_CONCURRENCY", "nan"),
    ("EVENTBUS_PARTNER_CONCURRENCY", "inf"), ("EVENTBUS_PARTNER_CONCURRENCY", "2.5"),
    ("EVENTBUS_PARTNER_CONCURRENCY", "1e30"), ("EVENTBUS_PARTNER_CONCURRENCY", "four"),
    ("EVENTBUS_PARTNER_CONCURRENCY", str(MAX_CONCURRENCY + 1)),
    ("EVENTBUS_PARTNER_CONCURRENCIES", "acme=nan"), ("EVENTBUS_PARTNER_CONCURRENCIES", "acme"),
    ("EVENTBUS_PARTNER_CONCURRENCIES", "=3"), ("EVENTBUS_PARTNER_CONCURRENCIES", "acme=-2"),
    ("EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS", "nan"),
    ("EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS", "-0.5"),
    ("EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS", "inf"),
    ("EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS", "1e300"),  # past half a lease
    ("EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS", "0"),
    ("EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS", "nan"),
    ("EVENTBUS_BREAKER_SLOW_SECONDS", "-1"), ("EVENTBUS_BREAKER_SLOW_SECONDS", "nan"),
    ("EVENTBUS_BREAKER_SLOW_SECONDS", "1e400"),  # inf
    ("EVENTBUS_BREAKER_SLOW_SHARE", "0"), ("EVENTBUS_BREAKER_SLOW_SHARE", "nan"),
    ("EVENTBUS_BREAKER_SLOW_SHARE", "1.5"), ("EVENTBUS_BREAKER_SLOW_SHARE", "-0.5"),
    ("EVENTBUS_BREAKER_SLOW_MIN_CALLS", "0"), ("EVENTBUS_BREAKER_SLOW_MIN_CALLS", "nan"),
    ("EVENTBUS_BREAKER_SLOW_MIN_CALLS", "1e9"),  # more than the window holds
    ("EVENTBUS_BREAKER_SLOW_WINDOW", "0"), ("EVENTBUS_BREAKER_SLOW_WINDOW", "inf"),
    ("EVENTBUS_BREAKER_SLOW_WINDOW", "5"),  # under the minimum of calls (10)
])
def test_a_hostile_value_stops_the_start_up_naming_its_variable(variable: str,
                                                                value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: value})


def test_zero_means_no_cap_no_wait_and_no_slow_calls() -> None:
    settings = Settings.from_env({"EVENTBUS_PARTNER_CONCURRENCY": "0",
                                  "EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS": "0",
                                  "EVENTBUS_BREAKER_SLOW_SECONDS": "0",
                                  "EVENTBUS_PARTNER_CONCURRENCIES": "acme=0, globex = 3"})
    assert (settings.partner_concurrency, settings.partner_concurrency_wait_seconds) == (0, 0)
    assert settings.partner_concurrencies == (("acme", 0), ("globex", 3))
    assert not Policy.from_settings(settings).slow.enabled


def test_per_partner_caps_are_kept_under_stored_names() -> None:
    settings = Settings.from_env({"EVENTBUS_PARTNER_CONCURRENCY": "4",
                                  "EVENTBUS_PARTNER_CONCURRENCIES": "sha256:x=1"})
    group = Partners.beside(MemoryEventStore(), settings)
    stored = group.get("sha256:x").name  # normalised once, as every lookup is
    assert stored != "sha256:x" and group.concurrency(stored) == 1
    assert group.concurrency("acme") == 4


def test_huge_but_finite_values_that_mean_something_are_kept() -> None:
    settings = Settings.from_env({"EVENTBUS_PARTNER_CONCURRENCY": str(MAX_CONCURRENCY),
                                  "EVENTBUS_BREAKER_SLOW_SECONDS": "1e300",
                                  "EVENTBUS_BREAKER_SLOW_WINDOW": "1000000"})
    slow = Policy.from_settings(settings).slow
    assert settings.partner_concurrency == MAX_CONCURRENCY
    assert not slow.is_slow(10**9) and slow.window == 1_000_000


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_number_setting_refuses_nan_and_inf(value: str) -> None:
    for variable in ("EVENTBUS_LEASE_SECONDS", "EVENTBUS_BREAKER_OPEN_SECONDS",
                     "EVENTBUS_TRACE_SAMPLE_RATIO"):
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env({variable: value})
