"""The partner app's settings: the library's ``Settings`` plus the partner endpoint.

Read once from the environment, like the library's: ``PartnerSettings`` is an
``eventbus.settings.EnvSettings`` whose fields name their variables
(``validation_alias``), with the library's types for their rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from eventbus.settings import EnvSettings, Flag, Names, Positive, Settings


def check_url_template(value: str) -> str:
    """Check a partner URL template at start-up: only ``{partnerId}``, and http(s).

    A pydantic validator because the rule is the app's own: a template that
    cannot be filled would otherwise fail every partner call, one event at a time.
    """
    try:
        url = value.format(partnerId="p")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad URL template: only {{partnerId}} may be used "
                         f"({type(exc).__name__}: {exc})") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http(s) URL template")
    return value


UrlTemplate = Annotated[str, AfterValidator(check_url_template)]
"""A partner URL template: http(s), ``{partnerId}`` its only placeholder."""


class PartnerSettings(EnvSettings):
    """Where and how the app calls partners."""

    url: UrlTemplate = Field(
        "http://127.0.0.1:9000/partners/{partnerId}/events",
        validation_alias="EVENTBUS_PARTNER_URL",
        description="OUT deliveries (`PARTNER_NOTIFY`); checked at start-up.")
    timeout_seconds: Positive = Field(
        5.0, validation_alias="EVENTBUS_PARTNER_TIMEOUT_SECONDS",
        description="The partner call's total deadline (connect, send and the whole answer).")
    extra_modules: Names = Field(
        (), validation_alias="EVENTBUS_HANDLER_MODULES",
        description="More handler modules to include (each exposes ``routes``), e.g. test "
                    "handlers; comma-separated.")
    notify_async: Flag = Field(
        False, validation_alias="EVENTBUS_PARTNER_NOTIFY_ASYNC",
        description="Run the partner call (``PARTNER_NOTIFY``) as an ``async def`` handler on "
                    "httpx: many calls await at once on one event loop instead of holding a "
                    "thread each.")


class AppSettings(EnvSettings):
    """Everything the partner app reads from the environment, once."""

    eventbus: Settings = Field(default_factory=Settings)
    partners: PartnerSettings = Field(default_factory=PartnerSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AppSettings:
        """Read the library's and the partner settings from ``environ``."""
        return cls(eventbus=Settings.from_env(environ),
                   partners=PartnerSettings.read_env(environ))
