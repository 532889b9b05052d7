"""Settings, read once from the environment into a frozen dataclass.

Shared by every layer; pure (standard library only). Applications read
their own settings the same way: ``read_env(MySettings, SOURCES)`` with the
``parse_*`` functions here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

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
    lease_seconds: float = 20.0
    max_attempts: int = 100
    retention_days: float = 30.0
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
    guard_collection: str = "side_effects"
    redrive_after_seconds: float = 1200.0
    """A FAILED-retryable record nothing redelivered for this long is published again by the
    redrive sweeper: twice the push subscription's maximum backoff (600 s)."""
    redrive_max: int = 20
    """Redrives before an event is given up for good (the attempt cap applies as well)."""
    redrive_backoff_cap_seconds: float = 6 * 3600.0
    log_level: str = "INFO"
    telemetry_exporter: str = "none"
    """Where spans go: ``none`` (no spans), ``cloudtrace``, ``otlp`` (``OTEL_EXPORTER_OTLP_*``),
    or ``noop`` (spans made and dropped, to measure their cost). Needs ``[telemetry]``."""
    metrics_exporter: str = "none"
    """``none``, ``prometheus`` (a ``/metrics`` page), ``otlp``, or ``noop`` (recorded, dropped)."""
    trace_sample_ratio: float = 1.0
    """Share of traces kept, decided on the trace id, so a cascade is kept or dropped whole."""
    metrics_interval_seconds: float = 60.0
    """How often ``otlp`` (and ``noop``) metrics are exported."""
    trace_libraries: tuple[str, ...] = ("pymongo", "requests")
    """Libraries instrumented when tracing is on (``none``: only the service's own spans)."""

    def __post_init__(self) -> None:
        """Refuse settings that would serve pushes unauthenticated while auth is on."""
        validate_auth(self.auth_enabled, self.auth_audience, self.auth_service_accounts)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``)."""
        return read_env(cls, SOURCES, environ)


def validate_auth(enabled: bool, audience: str, service_accounts: tuple[str, ...]) -> None:
    """Raise ``SettingsError`` when auth is on without an audience or an allow-list.

    Push auth fails closed: with no allowed service account, a token of any
    Google account would pass, so the service must not start that way.
    """
    if not enabled:
        return
    if isinstance(service_accounts, str):
        raise SettingsError("auth_service_accounts must be a tuple of e-mails, not one string")
    missing = [name for name, empty in (
        ("EVENTBUS_AUTH_SERVICE_ACCOUNTS", not any(a.strip() for a in service_accounts)),
        ("EVENTBUS_AUTH_AUDIENCE", not audience.strip())) if empty]
    if missing:
        raise SettingsError(f"EVENTBUS_AUTH is on but {' and '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} empty: push auth fails "
                            "closed; name the push service account(s) and the audience, "
                            "or turn EVENTBUS_AUTH off")


T = TypeVar("T")
Parser = Callable[[str], Any]


def read_env(cls: type[T], sources: Mapping[str, tuple[str, Parser]],
             environ: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` from the variables named in ``sources`` (field → (variable, parser)).

    Unset and empty variables keep the field's default; a value that cannot
    be parsed raises ``SettingsError`` naming the variable.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (var, parse) in sources.items():
        if env.get(var, "") != "":
            try:
                values[name] = parse(env[var])
            except SettingsError as exc:
                raise SettingsError(f"{var}: {exc}") from None
    return cls(**values)


def parse_float(value: str) -> float:
    """Parse a positive number."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if number <= 0:
        raise SettingsError(f"must be positive: {value!r}")
    return number


def parse_int(value: str) -> int:
    """Parse a positive whole number."""
    number = parse_float(value)
    if number != int(number):
        raise SettingsError(f"not a whole number: {value!r}")
    return int(number)


def parse_list(value: str) -> tuple[str, ...]:
    """Parse a comma-separated list; blanks are dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_bool(value: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off."""
    lowered = value.strip().lower()
    if lowered not in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        raise SettingsError(f"not a boolean: {value!r}")
    return lowered in {"1", "true", "yes", "on"}


def parse_str(value: str) -> str:
    """Take the value as it is."""
    return value


def parse_ratio(value: str) -> float:
    """Parse a share: a number above 0 and at most 1."""
    number = parse_float(value)
    if number > 1:
        raise SettingsError(f"must be at most 1: {value!r}")
    return number


def parse_choice(*choices: str) -> Parser:
    """Return a parser that accepts one of ``choices`` (any case)."""

    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise SettingsError(f"{value!r} is not one of {', '.join(choices)}")
        return lowered

    return parse


SOURCES: dict[str, tuple[str, Parser]] = {
    "mongodb_uri": ("MONGODB_URI", parse_str),
    "mongodb_db": ("MONGODB_DB", parse_str),
    "collection": ("EVENTBUS_COLLECTION", parse_str),
    "service": ("EVENTBUS_SERVICE", parse_str),
    "lease_seconds": ("EVENTBUS_LEASE_SECONDS", parse_float),
    "max_attempts": ("EVENTBUS_MAX_ATTEMPTS", parse_int),
    "retention_days": ("EVENTBUS_RETENTION_DAYS", parse_float),
    "project_id": ("GOOGLE_CLOUD_PROJECT", parse_str),
    "topic": ("PUBSUB_TOPIC", parse_str),
    "dead_letter_topic": ("EVENTBUS_DEAD_LETTER_TOPIC", parse_str),
    "max_body_bytes": ("EVENTBUS_MAX_BODY_BYTES", parse_int),
    "store_timeout_ms": ("EVENTBUS_STORE_TIMEOUT_MS", parse_int),
    "auth_enabled": ("EVENTBUS_AUTH", parse_bool),
    "auth_audience": ("EVENTBUS_AUTH_AUDIENCE", parse_str),
    "auth_service_accounts": ("EVENTBUS_AUTH_SERVICE_ACCOUNTS", parse_list),
    "relay_inline": ("EVENTBUS_RELAY_INLINE", parse_bool),
    "relay_budget_seconds": ("EVENTBUS_RELAY_BUDGET_SECONDS", parse_float),
    "guard_collection": ("EVENTBUS_GUARD_COLLECTION", parse_str),
    "redrive_after_seconds": ("EVENTBUS_REDRIVE_AFTER_SECONDS", parse_float),
    "redrive_max": ("EVENTBUS_REDRIVE_MAX", parse_int),
    "redrive_backoff_cap_seconds": ("EVENTBUS_REDRIVE_BACKOFF_CAP_SECONDS", parse_float),
    "log_level": ("LOG_LEVEL", parse_str),
    "telemetry_exporter": ("EVENTBUS_TELEMETRY_EXPORTER",
                           parse_choice("none", "cloudtrace", "otlp", "noop")),
    "metrics_exporter": ("EVENTBUS_METRICS_EXPORTER",
                         parse_choice("none", "prometheus", "otlp", "noop")),
    "trace_sample_ratio": ("EVENTBUS_TRACE_SAMPLE_RATIO", parse_ratio),
    "metrics_interval_seconds": ("EVENTBUS_METRICS_INTERVAL_SECONDS", parse_float),
    "trace_libraries": ("EVENTBUS_TRACE_LIBRARIES", parse_list),
}
"""Where each field of ``Settings`` comes from: field → (variable, parser)."""
