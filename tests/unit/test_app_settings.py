"""The partner app's settings (``handlers.settings``): the library's ``Settings`` plus partners.

Moved here from the library's tests: ``Settings`` lost ``partner_url``,
``partner_timeout_seconds`` and ``handler_modules``.
"""

import pytest

from eventbus.settings import Settings, SettingsError
from handlers.settings import AppSettings, PartnerSettings


def test_the_partner_url_is_a_template_checked_at_start_up() -> None:
    assert PartnerSettings().url == "http://127.0.0.1:9000/partners/{partnerId}/events"
    url = "https://partner.example/hooks/{partnerId}"
    assert AppSettings.from_env({"EVENTBUS_PARTNER_URL": url}).partners.url == url
    for bad in ("http://x/{orderId}", "ftp://x/{partnerId}", "x/{partnerId}", "http://x/{"):
        with pytest.raises(SettingsError, match="EVENTBUS_PARTNER_URL"):
            AppSettings.from_env({"EVENTBUS_PARTNER_URL": bad})


def test_handler_modules_name_extra_modules() -> None:
    settings = AppSettings.from_env({"EVENTBUS_HANDLER_MODULES": "handlers, tests.extra"})
    assert settings.partners.extra_modules == ("handlers", "tests.extra")
    assert AppSettings().partners.extra_modules == ()


def test_app_settings_read_both_parts_once_into_frozen_objects() -> None:
    settings = AppSettings.from_env({"MONGODB_URI": "mongodb://x/",
                                     "EVENTBUS_LEASE_SECONDS": "2.5",
                                     "EVENTBUS_PARTNER_TIMEOUT_SECONDS": "1.5"})
    assert settings.eventbus == Settings(mongodb_uri="mongodb://x/", lease_seconds=2.5)
    assert settings.partners == PartnerSettings(timeout_seconds=1.5)
    assert AppSettings() == AppSettings.from_env({})
    with pytest.raises(AttributeError):
        settings.partners.url = "http://elsewhere/{partnerId}"  # type: ignore[misc]


@pytest.mark.parametrize(("var", "value"), [("EVENTBUS_PARTNER_TIMEOUT_SECONDS", "0"),
                                            ("EVENTBUS_PARTNER_TIMEOUT_SECONDS", "soon"),
                                            ("EVENTBUS_LEASE_SECONDS", "soon")])
def test_bad_app_settings_say_what_is_wrong(var: str, value: str) -> None:
    with pytest.raises(SettingsError, match=var):
        AppSettings.from_env({var: value})
