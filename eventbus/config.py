"""Settings, read once from the environment into a frozen dataclass."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

# Pub/Sub caps message data at 10 MB; the push envelope base64-encodes it
# (4/3) and adds metadata, so this is the largest body a real push can have.
PUBSUB_MAX_DATA_BYTES = 10 * 1000 * 1000
DEFAULT_MAX_BODY_BYTES = PUBSUB_MAX_DATA_BYTES * 4 // 3 + 256 * 1024


class SettingsError(ValueError):
    """Raised when an environment variable holds a value that cannot be used."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every knob of the service. Build it with ``Settings.from_env()``."""

    mongodb_uri: str = "mongodb://127.0.0.1:27018/"
    mongodb_db: str = "partner_events"
    collection: str = "partner_events"
    service: str = "partner-eventbus"
    lease_seconds: float = 60.0
    max_attempts: int = 100
    retention_days: float = 30.0
    handler_modules: tuple[str, ...] = ("handlers",)
    project_id: str = "local-project"
    topic: str = "partner-events"
    dead_letter_topic: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    store_timeout_ms: int = 5000
    auth_enabled: bool = False
    auth_audience: str = ""
    auth_service_accounts: tuple[str, ...] = ()
    relay_inline: bool = True
    relay_budget_seconds: float = 2.0
    partner_timeout_seconds: float = 5.0
    partner_url: str = "http://127.0.0.1:9000/partners/{partnerId}/events"
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {name: parse(env[var]) for name, (var, parse) in _SOURCES.items()
                                  if env.get(var, "") != ""}
        return cls(**values)


def _float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if number <= 0:
        raise SettingsError(f"must be positive: {value!r}")
    return number


def _int(value: str) -> int:
    number = _float(value)
    if number != int(number):
        raise SettingsError(f"not a whole number: {value!r}")
    return int(number)


def _list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        raise SettingsError(f"not a boolean: {value!r}")
    return lowered in {"1", "true", "yes", "on"}


def _str(value: str) -> str:
    return value


def _url_template(value: str) -> str:
    # Checked at start-up: a template that cannot be filled would otherwise
    # fail every partner call, one event at a time.
    try:
        url = value.format(partnerId="p")
    except (KeyError, IndexError, ValueError) as exc:
        raise SettingsError(f"bad URL template {value!r}: only {{partnerId}} may be used "
                            f"({type(exc).__name__}: {exc})") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"not an http(s) URL template: {value!r}")
    return value


_SOURCES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "mongodb_uri": ("MONGODB_URI", _str),
    "mongodb_db": ("MONGODB_DB", _str),
    "collection": ("EVENTBUS_COLLECTION", _str),
    "service": ("EVENTBUS_SERVICE", _str),
    "lease_seconds": ("EVENTBUS_LEASE_SECONDS", _float),
    "max_attempts": ("EVENTBUS_MAX_ATTEMPTS", _int),
    "retention_days": ("EVENTBUS_RETENTION_DAYS", _float),
    "handler_modules": ("EVENTBUS_HANDLER_MODULES", _list),
    "project_id": ("GOOGLE_CLOUD_PROJECT", _str),
    "topic": ("PUBSUB_TOPIC", _str),
    "dead_letter_topic": ("EVENTBUS_DEAD_LETTER_TOPIC", _str),
    "max_body_bytes": ("EVENTBUS_MAX_BODY_BYTES", _int),
    "store_timeout_ms": ("EVENTBUS_STORE_TIMEOUT_MS", _int),
    "auth_enabled": ("EVENTBUS_AUTH", _bool),
    "auth_audience": ("EVENTBUS_AUTH_AUDIENCE", _str),
    "auth_service_accounts": ("EVENTBUS_AUTH_SERVICE_ACCOUNTS", _list),
    "relay_inline": ("EVENTBUS_RELAY_INLINE", _bool),
    "relay_budget_seconds": ("EVENTBUS_RELAY_BUDGET_SECONDS", _float),
    "partner_timeout_seconds": ("EVENTBUS_PARTNER_TIMEOUT_SECONDS", _float),
    "partner_url": ("EVENTBUS_PARTNER_URL", _url_template),
    "log_level": ("LOG_LEVEL", _str),
}
