"""The partner app's settings: the library's ``Settings`` plus the partner endpoint.

Read once from the environment, like the library's (``eventbus.settings.read_env``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from urllib.parse import urlsplit

from eventbus.settings import (
    Parser,
    Settings,
    SettingsError,
    parse_bool,
    parse_float,
    parse_list,
    read_env,
)


def parse_url_template(value: str) -> str:
    """Check a partner URL template at start-up.

    A template that cannot be filled would otherwise fail every partner call,
    one event at a time.
    """
    try:
        url = value.format(partnerId="p")
    except (KeyError, IndexError, ValueError) as exc:
        raise SettingsError(f"bad URL template {value!r}: only {{partnerId}} may be used "
                            f"({type(exc).__name__}: {exc})") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"not an http(s) URL template: {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PartnerSettings:
    """Where and how the app calls partners."""

    url: str = "http://127.0.0.1:9000/partners/{partnerId}/events"
    timeout_seconds: float = 5.0
    extra_modules: tuple[str, ...] = ()
    """More handler modules to include (each exposes ``routes``), e.g. test handlers."""
    notify_async: bool = False
    """Run the partner call (``PARTNER_NOTIFY``) as an ``async def`` handler on httpx: many
    calls await at once on one event loop instead of holding a thread each."""


PARTNER_SOURCES: dict[str, tuple[str, Parser]] = {
    "url": ("EVENTBUS_PARTNER_URL", parse_url_template),
    "timeout_seconds": ("EVENTBUS_PARTNER_TIMEOUT_SECONDS", parse_float),
    "extra_modules": ("EVENTBUS_HANDLER_MODULES", parse_list),
    "notify_async": ("EVENTBUS_PARTNER_NOTIFY_ASYNC", parse_bool),
}


@dataclasses.dataclass(frozen=True)
class AppSettings:
    """Everything the partner app reads from the environment, once."""

    eventbus: Settings = dataclasses.field(default_factory=Settings)
    partners: PartnerSettings = dataclasses.field(default_factory=PartnerSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AppSettings:
        """Read the library's and the partner settings from ``environ``."""
        return cls(Settings.from_env(environ), read_env(PartnerSettings, PARTNER_SOURCES, environ))
