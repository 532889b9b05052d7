import pytest

from eventbus.config import Settings, SettingsError
from eventbus.errors import (
    Classification,
    InvalidEvent,
    LeaseHeld,
    PayloadTooLarge,
    PermanentError,
    StoreUnavailable,
    classify,
)
from eventbus.http import STATUS, error_response
from eventbus.outcome import Outcome


def test_settings_read_the_environment_once_into_a_frozen_object() -> None:
    settings = Settings.from_env({"MONGODB_URI": "mongodb://x/", "EVENTBUS_LEASE_SECONDS": "2.5",
                                  "EVENTBUS_HANDLER_MODULES": "handlers, tests.extra",
                                  "EVENTBUS_AUTH": "true", "EVENTBUS_MAX_ATTEMPTS": ""})
    assert settings.mongodb_uri == "mongodb://x/" and settings.lease_seconds == 2.5
    assert settings.handler_modules == ("handlers", "tests.extra")
    assert settings.auth_enabled is True and settings.max_attempts == 100
    with pytest.raises(AttributeError):
        settings.lease_seconds = 1  # type: ignore[misc]


@pytest.mark.parametrize(("var", "value"), [("EVENTBUS_LEASE_SECONDS", "soon"),
                                            ("EVENTBUS_MAX_ATTEMPTS", "2.5"),
                                            ("EVENTBUS_MAX_ATTEMPTS", "-1"),
                                            ("EVENTBUS_AUTH", "maybe")])
def test_bad_settings_say_what_is_wrong(var: str, value: str) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env({var: value})


@pytest.mark.parametrize(("exc", "expected"), [
    (PermanentError("x"), Classification.PERMANENT),
    (InvalidEvent("x"), Classification.PERMANENT),
    (StoreUnavailable("x"), Classification.TRANSIENT),
    (LeaseHeld({"idempotency_key": "k"}), Classification.TRANSIENT),
    (KeyError("surprise"), Classification.TRANSIENT),
    (ZeroDivisionError(), Classification.TRANSIENT),
])
def test_unknown_exceptions_are_transient(exc: BaseException, expected: Classification) -> None:
    assert classify(exc) is expected


def test_every_outcome_has_a_status_and_only_acked_ones_are_2xx() -> None:
    for outcome in Outcome:
        assert (200 <= STATUS[outcome] < 300) == outcome.acked


def test_request_errors_carry_their_status() -> None:
    body, status = error_response(PayloadTooLarge("big"))
    assert status == 413 and body == {"error": "payload_too_large", "message": "big"}
