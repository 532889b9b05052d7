"""The settings on pydantic-settings take and refuse what the hand-written parsers did (issue 41).

``ORACLE`` holds the parsers ``eventbus.settings`` had before it moved onto
pydantic-settings, copied as they were; every variable kind is checked against
them on hostile text, drawn at random and listed by hand. The one difference,
on purpose: a whole number of 2**63 or more (``1e30`` attempts) is refused now,
where the old parser took it (no such count, port or timeout means anything,
and MongoDB's integers stop there).

Then what the pydantic layer itself must keep: frozen objects, the constructor
that never reads the process's environment, ``replace``, unknown keywords, and
errors that name the variable, the value and the rule in the project's words.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eventbus.settings import MAX_CONCURRENCY, Settings, SettingsError
from eventbus.settings_base import publish_target
from tests.hypothesis_profiles import examples

# --- the parsers as they were (eventbus/settings.py before issue 41), the oracle ---------


class OldError(ValueError):
    pass


def old_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise OldError from None
    if not math.isfinite(number) or number <= 0:
        raise OldError
    return number


def old_int(value: str) -> int:
    number = old_float(value)
    if number != int(number):
        raise OldError
    return int(number)


def old_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def old_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        raise OldError
    return lowered in {"1", "true", "yes", "on"}


def old_ratio(value: str) -> float:
    number = old_float(value)
    if number > 1:
        raise OldError
    return number


def old_rate(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise OldError from None
    if not math.isfinite(number) or number < 0:
        raise OldError
    return number


def old_concurrency(value: str) -> int:
    try:
        number = float(value)
    except ValueError:
        raise OldError from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise OldError
    if number > MAX_CONCURRENCY:
        raise OldError
    return int(number)


def old_pairs(parse: Callable[[str], Any]) -> Callable[[str], tuple[tuple[str, Any], ...]]:
    def pairs(value: str) -> tuple[tuple[str, Any], ...]:
        out = []
        for part in old_list(value):
            name, equals, number = part.partition("=")
            if not equals or not name.strip():
                raise OldError
            out.append((name.strip(), parse(number)))
        return tuple(out)

    return pairs


def old_seconds_or_zero(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise OldError from None
    if not math.isfinite(number) or number < 0:
        raise OldError
    return number


def old_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise OldError from None
    if not number >= 0 or number == float("inf"):
        raise OldError
    return number


def old_choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise OldError
        return lowered

    return parse


# One variable of each kind (none of them in a check across fields), its field and old parser.
ORACLE: dict[str, tuple[str, Callable[[str], Any]]] = {
    "MONGODB_URI": ("mongodb_uri", lambda value: value),
    "EVENTBUS_RETENTION_DAYS": ("retention_days", old_float),
    "EVENTBUS_MAX_ATTEMPTS": ("max_attempts", old_int),
    "EVENTBUS_RELAY_INLINE": ("relay_inline", old_bool),
    "EVENTBUS_TRACE_LIBRARIES": ("trace_libraries", old_list),
    "EVENTBUS_TRACE_SAMPLE_RATIO": ("trace_sample_ratio", old_ratio),
    "EVENTBUS_PARTNER_RATE": ("partner_rate", old_rate),
    "EVENTBUS_PARTNER_RATES": ("partner_rates", old_pairs(old_rate)),
    "EVENTBUS_PARTNER_CONCURRENCY": ("partner_concurrency", old_concurrency),
    "EVENTBUS_PARTNER_CONCURRENCIES": ("partner_concurrencies", old_pairs(old_concurrency)),
    "EVENTBUS_BREAKER_SLOW_SECONDS": ("breaker_slow_seconds", old_seconds_or_zero),
    "EVENTBUS_ASYNC_BLOCK_WARNING_SECONDS": ("async_block_warning_seconds", old_seconds),
    "EVENTBUS_TELEMETRY_EXPORTER": ("telemetry_exporter",
                                    old_choice("none", "cloudtrace", "otlp", "noop")),
}
REFUSED = "refused"
INT64 = 2**63


def old_outcome(variable: str, text: str) -> Any:
    field, parse = ORACLE[variable]
    if text == "":
        return getattr(Settings(), field)  # unset or empty: the default, as read_env did
    try:
        value = parse(text)
    except OldError:
        return REFUSED
    numbers = value if isinstance(value, tuple) else (value,)
    whole = [n[1] if isinstance(n, tuple) else n for n in numbers]
    if any(isinstance(n, int) and not isinstance(n, bool) and abs(n) >= INT64 for n in whole):
        return REFUSED  # the one difference on purpose (module docstring)
    return value


def new_outcome(variable: str, text: str) -> Any:
    field, _ = ORACLE[variable]
    try:
        return getattr(Settings.from_env({variable: text}), field)
    except SettingsError as exc:
        assert variable in str(exc)
        return REFUSED


def same(old: Any, new: Any) -> bool:
    """Equal, with the type the old parser gave (``1.0`` is not ``True``), nan never a value."""
    return old == new and type(old) is type(new) and (
        not isinstance(old, tuple) or all(same(a, b) for a, b in zip(old, new, strict=True)))


BY_HAND = ["", " ", "0", "-0", "-0.0", "1", "+3", " 2.5 ", "2.0", "2.", ".5", "1e3", "1E3",
           "1e-400", "1e30", "1e400", "-1e400", "1_000", "1__0", "_1", "0x10", "nan", "NaN",
           "-nan", "inf", "-inf", "Infinity", "infinity", "9" * 19, "9" * 30, "100000",
           "100001", "1.0000000000000001", "0.5", "1", "1.5", "\u0661\u0662", "\uff11",
           "true", "TRUE", " yes ", "On", "off", "t", "f", "y", "n", "2", "none", "NOOP",
           " CloudTrace ", "otlp ", "jaeger", "a", "a,b", " a , ,b ", ",", "acme=5",
           "acme=5,globex=0.5", "acme", "=3", "acme=", "acme=-1", "acme=nan", "acme = 3 ",
           "acme=1e30", "a=1=2", "acme=1,,globex=2", "mongodb://x/ "]


@pytest.mark.parametrize("variable", sorted(ORACLE))
@pytest.mark.parametrize("text", BY_HAND)
def test_every_kind_takes_and_refuses_what_it_did(variable: str, text: str) -> None:
    old, new = old_outcome(variable, text), new_outcome(variable, text)
    assert same(old, new), (variable, text, old, new)


TEXT = st.one_of(
    st.text(alphabet="0123456789.eE+-_ naifINF,=xt\t", max_size=12),
    st.builds(lambda name, number: f"{name}={number}",
              st.text(alphabet="ab ", max_size=3), st.text(alphabet="0123456789.e-", max_size=6)),
    st.text(max_size=8),
)


@settings(max_examples=examples(400), deadline=None)
@given(variable=st.sampled_from(sorted(ORACLE)), text=TEXT)
@example(variable="EVENTBUS_MAX_ATTEMPTS", text="9223372036854775807")
@example(variable="EVENTBUS_PARTNER_CONCURRENCIES", text="a=-0")
def test_hostile_text_is_taken_or_refused_as_the_old_parsers_did(variable: str,
                                                                  text: str) -> None:
    if "\x00" in text:
        return  # no environment carries NUL
    old, new = old_outcome(variable, text), new_outcome(variable, text)
    assert same(old, new), (variable, text, old, new)


def test_whole_numbers_past_64_bits_are_refused_where_they_were_taken() -> None:
    assert old_int("1e30") == int(1e30)  # the old parser took it
    with pytest.raises(SettingsError, match=r"EVENTBUS_MAX_ATTEMPTS: too large.*'1e30'"):
        Settings.from_env({"EVENTBUS_MAX_ATTEMPTS": "1e30"})
    assert Settings.from_env({"EVENTBUS_MAX_ATTEMPTS": "1e18"}).max_attempts == 10**18


# --- what the pydantic layer keeps ---------------------------------------------------


def test_the_settings_are_frozen_as_the_dataclasses_were() -> None:
    built = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.lease_seconds = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del built.topic
    assert hash(built) == hash(Settings()) and built == Settings()


def test_the_constructor_never_reads_the_process_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTBUS_LEASE_SECONDS", "3")
    monkeypatch.setenv("lease_seconds", "4")  # a variable named like the field: never read
    assert Settings().lease_seconds == 20.0
    assert Settings.from_env().lease_seconds == 3.0
    assert Settings.from_env({"lease_seconds": "4"}) == Settings()


def test_replace_validates_as_the_constructor_does() -> None:
    changed = Settings().replace(max_attempts=3, partner_rates=(("acme", 2),))
    assert (changed.max_attempts, changed.partner_rates) == (3, (("acme", 2.0),))
    with pytest.raises(SettingsError, match="EVENTBUS_MAX_ATTEMPTS: must be positive: 0"):
        Settings().replace(max_attempts=0)
    with pytest.raises(SettingsError, match="EVENTBUS_ORDER_WAIT_SECONDS"):
        Settings().replace(lease_seconds=1.5)  # the order wait (1 s) is past half a lease


def test_an_unknown_keyword_is_a_type_error_as_it_was() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'lease'"):
        Settings(lease=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(("environ", "message"), [
    ({"EVENTBUS_LEASE_SECONDS": "soon"}, "EVENTBUS_LEASE_SECONDS: not a number: 'soon'"),
    ({"EVENTBUS_LEASE_SECONDS": "0"}, "EVENTBUS_LEASE_SECONDS: must be positive: '0'"),
    ({"EVENTBUS_LEASE_SECONDS": "nan"},
     "EVENTBUS_LEASE_SECONDS: must be a finite number: 'nan'"),
    ({"EVENTBUS_MAX_ATTEMPTS": "2.5"}, "EVENTBUS_MAX_ATTEMPTS: not a whole number: '2.5'"),
    ({"EVENTBUS_TRACE_SAMPLE_RATIO": "1.5"},
     "EVENTBUS_TRACE_SAMPLE_RATIO: must be at most 1: '1.5'"),
    ({"EVENTBUS_PARTNER_CONCURRENCY": "100001"},
     "EVENTBUS_PARTNER_CONCURRENCY: must be at most 100000: '100001'"),
    ({"EVENTBUS_AUTH": "y"},
     "EVENTBUS_AUTH: not a boolean (1/0, true/false, yes/no, on/off): 'y'"),
    ({"EVENTBUS_METRICS_EXPORTER": "statsd"},
     "EVENTBUS_METRICS_EXPORTER: is not one of 'none', 'prometheus', 'otlp', 'noop': 'statsd'"),
    ({"EVENTBUS_PARTNER_RATES": "acme=1,globex"},
     "EVENTBUS_PARTNER_RATES: 'globex' is not name=rate: 'acme=1,globex'"),
    ({"EVENTBUS_PARTNER_RATES": "acme"}, "EVENTBUS_PARTNER_RATES: not name=rate: 'acme'"),
    ({"EVENTBUS_PARTNER_CONCURRENCIES": "acme=1,globex=-2"},
     "EVENTBUS_PARTNER_CONCURRENCIES: must be 0 or more: -2.0 in 'acme=1,globex=-2'"),
    ({"EVENTBUS_ORDER_WAIT_SECONDS": "10"},
     "EVENTBUS_ORDER_WAIT_SECONDS (10) must be less than half of EVENTBUS_LEASE_SECONDS (20)"),
])
def test_an_error_names_the_variable_the_value_and_the_rule(environ: dict[str, str],
                                                            message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(environ)
    assert str(raised.value) == message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_every_bad_variable_is_named_at_once_in_pydantic_words_never() -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"EVENTBUS_LEASE_SECONDS": "0", "EVENTBUS_RELAY_INLINE": "maybe",
                           "EVENTBUS_TELEMETRY_EXPORTER": "jaeger"})
    text = str(raised.value)
    for variable in ("EVENTBUS_LEASE_SECONDS", "EVENTBUS_RELAY_INLINE",
                     "EVENTBUS_TELEMETRY_EXPORTER"):
        assert variable in text
    for pydantic_words in ("Input should", "validation error", "pydantic", "errors.pydantic"):
        assert pydantic_words not in text


def test_the_publisher_reads_the_same_two_variables_and_defaults_as_the_settings() -> None:
    assert publish_target({}) == (Settings().project_id, Settings().topic)
    environ = {"GOOGLE_CLOUD_PROJECT": "proj", "PUBSUB_TOPIC": "bus"}
    read = Settings.from_env(environ)
    assert publish_target(environ) == (read.project_id, read.topic) == ("proj", "bus")
    empty = {"GOOGLE_CLOUD_PROJECT": "", "PUBSUB_TOPIC": ""}
    assert publish_target(empty) == publish_target({})
