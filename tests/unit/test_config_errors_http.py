import pytest

from eventbus.model.errors import (
    Classification,
    Classifier,
    InvalidEvent,
    LeaseHeld,
    PayloadTooLarge,
    PermanentError,
    StoreUnavailable,
)
from eventbus.model.outcome import Outcome
from eventbus.settings import Settings, SettingsError
from eventbus.web.http_status import STATUS, error_response


def test_settings_read_the_environment_once_into_a_frozen_object() -> None:
    settings = Settings.from_env({"MONGODB_URI": "mongodb://x/", "EVENTBUS_LEASE_SECONDS": "2.5",
                                  "EVENTBUS_GUARD_COLLECTION": "effects",
                                  "EVENTBUS_AUTH": "true", "EVENTBUS_MAX_ATTEMPTS": "",
                                  # auth on needs both (it fails closed: see test_auth.py)
                                  "EVENTBUS_AUTH_AUDIENCE": "https://svc.example/",
                                  "EVENTBUS_AUTH_SERVICE_ACCOUNTS": "push@p.iam"})
    assert settings.mongodb_uri == "mongodb://x/" and settings.lease_seconds == 2.5
    assert settings.guard_collection == "effects"
    assert settings.auth_enabled is True and settings.max_attempts == 100
    with pytest.raises(AttributeError):
        settings.lease_seconds = 1  # type: ignore[misc]


def test_the_library_settings_know_nothing_of_the_app() -> None:
    # handler_modules and the partner settings moved to handlers.settings (test_app_settings.py).
    names = set(Settings.model_fields)
    assert not names & {"handler_modules", "partner_url", "partner_timeout_seconds"}
    assert Settings().guard_collection == "side_effects"
    assert Settings.from_env({"EVENTBUS_HANDLER_MODULES": "x",
                              "EVENTBUS_PARTNER_URL": "bad"}) == Settings()


@pytest.mark.parametrize(("var", "value"), [("EVENTBUS_LEASE_SECONDS", "soon"),
                                            ("EVENTBUS_MAX_ATTEMPTS", "2.5"),
                                            ("EVENTBUS_MAX_ATTEMPTS", "-1"),
                                            ("EVENTBUS_AUTH", "maybe")])
def test_bad_settings_say_what_is_wrong(var: str, value: str) -> None:
    with pytest.raises(SettingsError, match=var):
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
    assert Classifier().classify(exc) is expected


class Refused(Exception):
    pass


def test_a_classifier_adds_permanent_types_and_predicates_per_instance() -> None:
    coded = ValueError("code 11")
    strict = Classifier(permanent=(Refused,), predicates=(lambda exc: "code 11" in str(exc),))
    assert strict.classify(Refused()) is Classification.PERMANENT
    assert strict.classify(coded) is Classification.PERMANENT
    assert strict.classify(ValueError("code 12")) is Classification.TRANSIENT
    assert strict.classify(PermanentError("x")) is Classification.PERMANENT  # always counts
    default = Classifier()  # another instance is not affected
    assert default.classify(Refused()) is Classification.TRANSIENT
    assert default.classify(coded) is Classification.TRANSIENT


def test_a_predicate_that_raises_does_not_match_and_never_escapes() -> None:
    # Written for a driver's errors (``exc.code``), applied to every exception.
    coded = Classifier(predicates=(lambda exc: exc.code == 11000,))  # type: ignore[attr-defined]
    assert coded.classify(ValueError("no code")) is Classification.TRANSIENT
    assert coded.classify(PermanentError("x")) is Classification.PERMANENT
    later = Classifier(predicates=(lambda exc: 1 / 0 > 0, lambda exc: True))
    assert later.classify(ValueError()) is Classification.PERMANENT  # the next rule still runs


def test_every_outcome_has_a_status_and_only_acked_ones_are_2xx() -> None:
    for outcome in Outcome:
        assert (200 <= STATUS[outcome] < 300) == outcome.acked


def test_request_errors_carry_their_status() -> None:
    body, status = error_response(PayloadTooLarge("big"))
    assert status == 413 and body == {"error": "payload_too_large", "message": "big"}
