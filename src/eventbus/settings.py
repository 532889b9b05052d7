"""Settings, read once from the environment into a frozen dataclass.

Shared by every layer; pure (standard library only). Each field of
``Settings`` names its environment variable, its parser and a one-line doc
once, in its own metadata (``setting(...)``); ``SOURCES`` and the reference
``docs/CONFIGURATION.md`` (``reference_markdown()``) are derived from it.
Applications read their own settings the same way: fields made with
``setting``, then ``read_env(MySettings, sources(MySettings))`` with the
``parse_*`` functions here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

# Pub/Sub caps message data at 10 MB; the push envelope base64-encodes it
# (4/3) and adds metadata, so this is the largest body a real push can have.
PUBSUB_MAX_DATA_BYTES = 10 * 1000 * 1000
DEFAULT_MAX_BODY_BYTES = PUBSUB_MAX_DATA_BYTES * 4 // 3 + 256 * 1024

REGENERATE = ".venv/bin/python docs/configuration.py"
"""The command that rewrites ``docs/CONFIGURATION.md`` from ``reference_markdown()``."""


class SettingsError(ValueError):
    """Raised when an environment variable holds a value that cannot be used."""


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
    """Parse a positive, finite number (``nan`` and ``inf`` are refused)."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    # nan passes every "<= 0" test and inf turns a wait into a hang: neither is a setting.
    if not math.isfinite(number):
        raise SettingsError(f"must be a finite number: {value!r}")
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


def parse_rate(value: str) -> float:
    """Parse a rate in calls per second: a finite number, 0 or more (0: no limit)."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise SettingsError(f"must be 0 (no limit) or a positive number: {value!r}")
    return number


def parse_rates(value: str) -> tuple[tuple[str, float], ...]:
    """Parse ``name=rate`` pairs, comma-separated (``acme=5,globex=0.5``; ``acme=0``: no limit)."""
    pairs = []
    for part in parse_list(value):
        name, equals, rate = part.partition("=")
        if not equals or not name.strip():
            raise SettingsError(f"not name=rate: {part!r}")
        pairs.append((name.strip(), parse_rate(rate)))
    return tuple(pairs)


MAX_CONCURRENCY = 100_000
"""The largest per-partner cap accepted: more calls in flight than any process holds."""


def parse_concurrency(value: str) -> int:
    """Parse a cap on calls in flight: a whole number from 0 (no cap) to ``MAX_CONCURRENCY``."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise SettingsError(f"must be 0 (no cap) or a whole number of calls: {value!r}")
    if number > MAX_CONCURRENCY:
        raise SettingsError(f"must be at most {MAX_CONCURRENCY}: {value!r}")
    return int(number)


def parse_concurrencies(value: str) -> tuple[tuple[str, int], ...]:
    """Parse ``name=cap`` pairs, comma-separated (``acme=4,globex=1``; ``acme=0``: no cap)."""
    pairs = []
    for part in parse_list(value):
        name, equals, cap = part.partition("=")
        if not equals or not name.strip():
            raise SettingsError(f"not name=cap: {part!r}")
        pairs.append((name.strip(), parse_concurrency(cap)))
    return tuple(pairs)


def parse_seconds_or_zero(value: str) -> float:
    """Parse a duration in seconds: a finite number, 0 or more (0: off, or no wait)."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise SettingsError(f"must be 0 or a finite number of seconds: {value!r}")
    return number


def parse_choice(*choices: str) -> Parser:
    """Return a parser that accepts one of ``choices`` (any case)."""

    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise SettingsError(f"{value!r} is not one of {', '.join(choices)}")
        return lowered

    return parse


def parse_seconds(value: str) -> float:
    """Parse a duration in seconds: a finite number, 0 or more (0: off, or at once)."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"not a number: {value!r}") from None
    if not number >= 0 or number == float("inf"):
        raise SettingsError(f"must be 0 or a positive number of seconds: {value!r}")
    return number


def setting(default: Any = dataclasses.MISSING, *, env: str, parse: Parser, doc: str,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field read from the variable ``env`` with ``parse``; ``doc`` says what it does.

    Give ``default``, or ``default_factory`` for a mutable default. The three
    are kept in the field's metadata, where ``sources`` and ``settings_table``
    find them.
    """
    metadata = {"env": env, "parse": parse, "doc": doc}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def sources(cls: type) -> dict[str, tuple[str, Parser]]:
    """Where each field of the dataclass ``cls`` comes from: field → (variable, parser).

    Read from the fields' metadata (``setting``); fields without any are left out.
    """
    return {field.name: (field.metadata["env"], field.metadata["parse"])
            for field in dataclasses.fields(cls) if "env" in field.metadata}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every knob of the service. Build it with ``Settings.from_env()``."""

    mongodb_uri: str = setting(
        "mongodb://127.0.0.1:27018/", env="MONGODB_URI", parse=parse_str,
        doc="Any MongoDB: Atlas, a replica set, a local `mongod` or the `localdb` tool "
            "(`infra/localdb`).")
    mongodb_db: str = setting(
        "partner_events", env="MONGODB_DB", parse=parse_str,
        doc="The database of the event and guard collections.")
    collection: str = setting(
        "partner_events", env="EVENTBUS_COLLECTION", parse=parse_str,
        doc="The event collection: one document per idempotency key.")
    service: str = setting(
        "partner-eventbus", env="EVENTBUS_SERVICE", parse=parse_str,
        doc="The service's name: `service` in log lines, `createdBy` in stored records.")
    lease_seconds: float = setting(
        20.0, env="EVENTBUS_LEASE_SECONDS", parse=parse_float,
        doc="Claim and guard lease, renewed every quarter lease while a handler runs: "
            "a killed worker's event is free again within one lease.")
    max_attempts: int = setting(
        100, env="EVENTBUS_MAX_ATTEMPTS", parse=parse_int,
        doc="Attempt cap: past it an event is `FAILED` for good and acked.")
    retention_days: float = setting(
        30.0, env="EVENTBUS_RETENTION_DAYS", parse=parse_float,
        doc="How long records are kept: `expire_at` (the TTL index) is `created` plus this.")
    project_id: str = setting(
        "local-project", env="GOOGLE_CLOUD_PROJECT", parse=parse_str,
        doc="The Google Cloud project published to (`PUBSUB_EMULATOR_HOST` is read by "
            "google-cloud-pubsub itself).")
    topic: str = setting(
        "partner-events", env="PUBSUB_TOPIC", parse=parse_str,
        doc="The event-bus topic that `publish`, the relay and replays publish to.")
    dead_letter_topic: str = setting(
        "", env="EVENTBUS_DEAD_LETTER_TOPIC", parse=parse_str,
        doc="The push subscription's dead-letter topic (empty: `<topic>-dlq`); the operator "
            "tools name the subscription `eventbus dlq drain` pulls after it.")
    max_body_bytes: int = setting(
        DEFAULT_MAX_BODY_BYTES, env="EVENTBUS_MAX_BODY_BYTES", parse=parse_int,
        doc="Larger push bodies are answered 413 (the default, about 13.6 MB, is 10 MB of "
            "data base64-encoded plus the envelope).")
    store_timeout_ms: int = setting(
        5000, env="EVENTBUS_STORE_TIMEOUT_MS", parse=parse_int,
        doc="MongoDB server-selection and socket timeout: a down store answers 503 well "
            "inside the ack deadline.")
    auth_enabled: bool = setting(
        False, env="EVENTBUS_AUTH", parse=parse_bool,
        doc="Verify the OIDC token of every push; on with no audience or no service "
            "accounts, the service refuses to start.")
    auth_audience: str = setting(
        "", env="EVENTBUS_AUTH_AUDIENCE", parse=parse_str,
        doc="The `aud` push tokens must carry (required when `EVENTBUS_AUTH` is on).")
    auth_service_accounts: tuple[str, ...] = setting(
        (), env="EVENTBUS_AUTH_SERVICE_ACCOUNTS", parse=parse_list,
        doc="Comma-separated service-account e-mails allowed to push (required when "
            "`EVENTBUS_AUTH` is on).")
    relay_inline: bool = setting(
        True, env="EVENTBUS_RELAY_INLINE", parse=parse_bool,
        doc="Publish a handler's children right after its `SUCCESS` (else only the "
            "`eventbus relay` sweeper does).")
    relay_budget_seconds: float = setting(
        2.0, env="EVENTBUS_RELAY_BUDGET_SECONDS", parse=parse_float,
        doc="The most the inline relay may delay the ack; what is left is the sweeper's.")
    relay_parallel: int = setting(
        8, env="EVENTBUS_RELAY_PARALLEL", parse=parse_int,
        doc="How many parents of a pulled batch the inline relay publishes the children of "
            "at once (each publish waits for Pub/Sub's answer); parents whose children share "
            "an ordering key go one after another.")
    async_concurrency: int = setting(
        100, env="EVENTBUS_ASYNC_CONCURRENCY", parse=parse_int,
        doc="How many `async def` handlers may await at once in one process (they run on "
            "the processor's one event loop; a batch's sync handlers keep their threads). "
            "A waiting coroutine costs kilobytes, a thread megabytes: far above "
            "`--concurrency`.")
    async_block_warning_seconds: float = setting(
        0.5, env="EVENTBUS_ASYNC_BLOCK_WARNING_SECONDS", parse=parse_seconds,
        doc="An async handler that holds the event loop this long (`time.sleep` or a sync "
            "client inside `async def`) is named in a warning; 0 turns the watchdog off.")
    async_stop_grace_seconds: float = setting(
        5.0, env="EVENTBUS_ASYNC_STOP_GRACE_SECONDS", parse=parse_seconds,
        doc="At shutdown (a worker's SIGTERM, the ASGI app's lifespan end), async handlers "
            "still awaiting after this long are cancelled: their events are given back "
            "(nacked or 503, the attempt not spent) and come back.")
    guard_collection: str = setting(
        "side_effects", env="EVENTBUS_GUARD_COLLECTION", parse=parse_str,
        doc="The collection of guarded side effects (`context.guard`), one document per key.")
    redrive_after_seconds: float = setting(
        1200.0, env="EVENTBUS_REDRIVE_AFTER_SECONDS", parse=parse_float,
        doc="A FAILED-retryable record nothing redelivered for this long is published again "
            "by the redrive sweeper: twice the push subscription's maximum backoff (600 s).")
    order_wait_seconds: float = setting(
        1.0, env="EVENTBUS_ORDER_WAIT_SECONDS", parse=parse_float,
        doc="How long an event of an ordered handler (`ordered_by`) waits for its entity while "
            "another event of it runs; then it is answered as in progress (503, nacked) and "
            "comes back later, its attempt not spent. Less than half of "
            "`EVENTBUS_LEASE_SECONDS`: the claims wait under their lease.")
    redrive_max: int = setting(
        20, env="EVENTBUS_REDRIVE_MAX", parse=parse_int,
        doc="Redrives before an event is given up for good (the attempt cap applies as well).")
    redrive_backoff_cap_seconds: float = setting(
        6 * 3600.0, env="EVENTBUS_REDRIVE_BACKOFF_CAP_SECONDS", parse=parse_float,
        doc="The longest wait between two redrives of an event (the wait doubles each time).")
    partner_collection: str = setting(
        "partners", env="EVENTBUS_PARTNER_COLLECTION", parse=parse_str,
        doc="The collection of partner breakers and shared rate buckets (`context.partner`).")
    rebuild_collection: str = setting(
        "rebuilds", env="EVENTBUS_REBUILD_COLLECTION", parse=parse_str,
        doc="The collection of `eventbus rebuild` runs: selection, checkpoint and counts.")
    breaker_failures: int = setting(
        5, env="EVENTBUS_BREAKER_FAILURES", parse=parse_int,
        doc="Consecutive transient failures of a partner's calls that open its breaker.")
    breaker_open_seconds: float = setting(
        30.0, env="EVENTBUS_BREAKER_OPEN_SECONDS", parse=parse_float,
        doc="How long an opened breaker refuses calls before one probe goes through; "
            "doubles while probes fail.")
    breaker_open_cap_seconds: float = setting(
        600.0, env="EVENTBUS_BREAKER_OPEN_CAP_SECONDS", parse=parse_float,
        doc="The longest a breaker stays open between two probes.")
    breaker_probe_seconds: float = setting(
        30.0, env="EVENTBUS_BREAKER_PROBE_SECONDS", parse=parse_float,
        doc="How long a half-open breaker waits for its probe's answer before another call "
            "may probe (longer than a partner call's deadline).")
    breaker_slow_seconds: float = setting(
        0.0, env="EVENTBUS_BREAKER_SLOW_SECONDS", parse=parse_seconds_or_zero,
        doc="A partner call that takes at least this long (on this process's monotonic "
            "clock) is slow; enough slow calls open the breaker as failures do (0: off). "
            "Set it under the partner call's deadline.")
    breaker_slow_share: float = setting(
        0.5, env="EVENTBUS_BREAKER_SLOW_SHARE", parse=parse_ratio,
        doc="The share of a partner's recent calls (`EVENTBUS_BREAKER_SLOW_WINDOW`) that, "
            "slow, opens its breaker (resilience4j's `slowCallRateThreshold`, as a share).")
    breaker_slow_min_calls: int = setting(
        10, env="EVENTBUS_BREAKER_SLOW_MIN_CALLS", parse=parse_int,
        doc="How many recent calls a process must have seen before their slow share may open "
            "the breaker (resilience4j's `minimumNumberOfCalls`).")
    breaker_slow_window: int = setting(
        20, env="EVENTBUS_BREAKER_SLOW_WINDOW", parse=parse_int,
        doc="How many of a partner's latest calls each process keeps to count the slow share "
            "(a count-based sliding window; at least `EVENTBUS_BREAKER_SLOW_MIN_CALLS`).")
    partner_rate: float = setting(
        0.0, env="EVENTBUS_PARTNER_RATE", parse=parse_rate,
        doc="Calls per second to each partner, shared by every instance through one token "
            "bucket in the store, decided on the store's clock: over any span T at most "
            "rate * T + burst calls go, wherever T starts (0: no limit).")
    partner_rates: tuple[tuple[str, float], ...] = setting(
        (), env="EVENTBUS_PARTNER_RATES", parse=parse_rates,
        doc="Per-partner overrides of `EVENTBUS_PARTNER_RATE`: `name=rate`, comma-separated "
            "(`name=0`: no limit for that partner).")
    partner_rate_wait_seconds: float = setting(
        1.0, env="EVENTBUS_PARTNER_RATE_WAIT_SECONDS", parse=parse_float,
        doc="The longest a call over its partner's rate waits; a longer wait parks its event.")
    partner_concurrency: int = setting(
        0, env="EVENTBUS_PARTNER_CONCURRENCY", parse=parse_concurrency,
        doc="A bulkhead: the most calls to one partner in flight at once in this process "
            "(each process has its own; 0: no cap). A call over it waits up to "
            "`EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS`, then its event is parked as a "
            "rate-limited one is (stored, acked, redriven), never answered 503.")
    partner_concurrencies: tuple[tuple[str, int], ...] = setting(
        (), env="EVENTBUS_PARTNER_CONCURRENCIES", parse=parse_concurrencies,
        doc="Per-partner overrides of `EVENTBUS_PARTNER_CONCURRENCY`: `name=cap`, "
            "comma-separated (`name=0`: no cap for that partner).")
    partner_concurrency_wait_seconds: float = setting(
        0.2, env="EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS", parse=parse_seconds_or_zero,
        doc="The longest a call over its partner's bulkhead waits for a free slot (0: none); "
            "then its event is parked for `EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS`. Less "
            "than half of `EVENTBUS_LEASE_SECONDS`: the call waits under its claim's lease.")
    partner_concurrency_park_seconds: float = setting(
        1.0, env="EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS", parse=parse_float,
        doc="How long an event over its partner's bulkhead is parked: its `redrive_at` is "
            "this far ahead on the store's clock.")
    partner_burst_seconds: float = setting(
        1.0, env="EVENTBUS_PARTNER_BURST_SECONDS", parse=parse_float,
        doc="A partner's burst: its token bucket holds this many seconds' worth of calls "
            "(rate * this, at least 1), which may go at once after a quiet spell.")
    log_level: str = setting(
        "INFO", env="LOG_LEVEL", parse=parse_str,
        doc="The level of the service's log lines (`DEBUG`, `INFO`, `WARNING`, ...).")
    telemetry_exporter: str = setting(
        "none", env="EVENTBUS_TELEMETRY_EXPORTER",
        parse=parse_choice("none", "cloudtrace", "otlp", "noop"),
        doc="Where spans go: `none` (no spans), `cloudtrace`, `otlp` (`OTEL_EXPORTER_OTLP_*`), "
            "or `noop` (spans made and dropped, to measure their cost). Needs `[telemetry]`.")
    metrics_exporter: str = setting(
        "none", env="EVENTBUS_METRICS_EXPORTER",
        parse=parse_choice("none", "prometheus", "otlp", "noop"),
        doc="`none`, `prometheus` (a `/metrics` page), `otlp`, or `noop` (recorded, dropped).")
    trace_sample_ratio: float = setting(
        0.1, env="EVENTBUS_TRACE_SAMPLE_RATIO", parse=parse_ratio,
        doc="Share of traces kept, decided on the trace id, so a cascade is kept or "
            "dropped whole; the answer to tracing's cost (bench/README.md).")
    metrics_interval_seconds: float = setting(
        60.0, env="EVENTBUS_METRICS_INTERVAL_SECONDS", parse=parse_float,
        doc="How often `otlp` (and `noop`) metrics are exported.")
    trace_libraries: tuple[str, ...] = setting(
        ("requests",), env="EVENTBUS_TRACE_LIBRARIES", parse=parse_list,
        doc="Libraries instrumented when tracing is on: `requests` (partner calls), "
            "`pymongo` (a span per round trip), `none`.")

    def __post_init__(self) -> None:
        """Refuse settings that would serve pushes unauthenticated while auth is on, that
        would let an event's claim lapse while it waits for its entity or a partner's
        bulkhead, or a slow-call window smaller than its minimum of calls."""
        validate_auth(self.auth_enabled, self.auth_audience, self.auth_service_accounts)
        # The waits for a busy entity or bulkhead run under the claims' renewed leases, but a
        # wait as long as half a lease leaves a single missed renewal no margin.
        if self.order_wait_seconds * 2 >= self.lease_seconds:
            raise SettingsError(
                f"EVENTBUS_ORDER_WAIT_SECONDS ({self.order_wait_seconds:g}) must be less than "
                f"half of EVENTBUS_LEASE_SECONDS ({self.lease_seconds:g})")
        if self.partner_concurrency_wait_seconds * 2 >= self.lease_seconds:
            raise SettingsError(
                f"EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS "
                f"({self.partner_concurrency_wait_seconds:g}) must be less than half of "
                f"EVENTBUS_LEASE_SECONDS ({self.lease_seconds:g})")
        if self.breaker_slow_window < self.breaker_slow_min_calls:
            raise SettingsError(
                f"EVENTBUS_BREAKER_SLOW_WINDOW ({self.breaker_slow_window}) must be at least "
                f"EVENTBUS_BREAKER_SLOW_MIN_CALLS ({self.breaker_slow_min_calls})")

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


SOURCES: dict[str, tuple[str, Parser]] = sources(Settings)
"""Where each field of ``Settings`` comes from: field → (variable, parser), from its metadata."""


def format_default(value: Any) -> str:
    """A default as the reference shows it: what the environment variable would hold."""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple | list):
        value = ",".join("=".join(map(str, item)) if isinstance(item, tuple) else str(item)
                         for item in value)
    return f"`{value}`" if value != "" else "empty"


def settings_table(cls: type) -> str:
    """A Markdown table of the settings of the dataclass ``cls``: variable, default, doc.

    Fields without ``setting`` metadata are left out.
    """
    lines = ["| variable | field | default | what it does |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(cls):
        if "env" not in field.metadata:
            continue
        factory = field.default_factory
        default = factory() if callable(factory) else field.default
        doc = " ".join(field.metadata["doc"].split()).replace("|", "\\|")
        lines.append(f"| `{field.metadata['env']}` | `{field.name}` | "
                     f"{format_default(default)} | {doc} |")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """The configuration reference: every ``Settings`` variable, its default, what it does.

    ``docs/CONFIGURATION.md`` holds this text; ``REGENERATE`` rewrites it.
    """
    return "\n".join([
        "# Configuration",
        "",
        "Generated from the fields of `eventbus.settings.Settings` (each declares its",
        "variable, parser and doc once, with `setting(...)`); do not edit by hand.",
        "Regenerate it with",
        "",
        "```sh",
        REGENERATE,
        "```",
        "",
        "Read once from the environment (`eventbus.settings.read_env`): an unset or empty",
        "variable keeps the default; a value that cannot be parsed stops the start-up with",
        "a message naming the variable.",
        "",
        settings_table(Settings),
    ])
