"""Settings, read once from the environment into frozen pydantic-settings models.

Shared by every layer. Each field of ``Settings`` names its environment
variable (``validation_alias``) and a one-line doc (``description``) once, in
its ``Field``; its type carries its rule (``Positive``: a finite number above
0, ``Ratio``: above 0 and at most 1, ...), checked by pydantic's own
constraints. ``variables()`` and the reference ``docs/CONFIGURATION.md``
(``reference_markdown()``) are read from the fields.

Applications declare their own settings the same way: a subclass of
``EnvSettings`` whose fields are ``Field(default, validation_alias=VARIABLE,
description=...)`` with the types here, read by ``MySettings.read_env()``.

What pydantic does natively is left to it: numbers' bounds and finiteness,
whole numbers, choices (``Literal``), tuples. The validators that remain
(``env_number``, ``env_bool``, ``env_choice``, ``env_list``, ``pairs_of``) keep
the variables' own syntax, which is not pydantic's: comma-separated lists and
``name=value`` pairs instead of JSON, the eight words of a boolean, choices
in any case, and numbers as Python's ``float()`` reads them. Each says why in
its docstring.

A value that breaks its rule raises ``SettingsError`` (``eventbus.settings_base``,
which a publisher imports without pydantic) naming the variable, the value
and the rule; pydantic's ``ValidationError`` never leaves the constructors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NoReturn, Self

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from eventbus.settings_base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PROJECT_ID,
    DEFAULT_TOPIC,
    PROJECT_VARIABLE,
    PUBSUB_MAX_DATA_BYTES,
    TOPIC_VARIABLE,
    SettingsError,
)

__all__ = [
    "BOOLEANS", "DEFAULT_MAX_BODY_BYTES", "MAX_CONCURRENCY", "PUBSUB_MAX_DATA_BYTES",
    "REGENERATE", "RULES", "VARIABLES", "Concurrencies", "Concurrency", "EnvSettings",
    "EnvironSource", "Flag", "MetricsExporter", "Names", "Positive", "PositiveInt", "Rate",
    "Rates", "Ratio", "Seconds", "Settings", "SettingsError", "SpanExporter", "env_bool",
    "env_choice", "env_list", "env_number", "format_default", "pairs_of", "reference_markdown",
    "settings_error", "settings_table", "validate_auth", "variables",
]

REGENERATE = ".venv/bin/python docs/configuration.py"
"""The command that rewrites ``docs/CONFIGURATION.md`` from ``reference_markdown()``."""

MAX_CONCURRENCY = 100_000
"""The largest per-partner cap accepted: more calls in flight than any process holds."""


# The variables' own syntax, read before pydantic checks the result against the field's type.

def env_number(value: Any) -> Any:
    """Read a string as Python's ``float()`` does; pydantic then checks the number.

    Kept because pydantic's own string parsing is narrower than what these
    variables have always taken: its ``int`` refuses whole numbers written as
    floats (``1e3``, ``2.``) and its ``float`` the non-ASCII digits ``float()``
    reads. The rules (above 0, finite, whole, at most ...) stay pydantic's
    constraints on the number this returns. Anything but a string passes as it is.
    """
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError("not a number") from None


BOOLEANS = {"1": True, "true": True, "yes": True, "on": True,
            "0": False, "false": False, "no": False, "off": False}
"""The words a boolean variable takes (any case, blanks around them ignored)."""


def env_bool(value: Any) -> Any:
    """Take the eight words of ``BOOLEANS`` only, in any case, blanks around them ignored.

    Kept because pydantic's ``bool`` takes more (``t``, ``f``, ``y``, ``n``) and
    refuses the blanks: a boolean variable takes what it always took.
    """
    if not isinstance(value, str):
        return value
    word = value.strip().lower()
    if word not in BOOLEANS:
        raise ValueError("not a boolean (1/0, true/false, yes/no, on/off)")
    return BOOLEANS[word]


def env_choice(value: Any) -> Any:
    """Lower-case a choice and drop the blanks around it; its ``Literal`` then checks it.

    Kept because pydantic's ``Literal`` is case-sensitive, and the choices have
    always been taken in any case (``CloudTrace``).
    """
    return value.strip().lower() if isinstance(value, str) else value


def env_list(value: Any) -> Any:
    """Split a comma-separated string into a tuple, blanks dropped (``a, b,`` is ``("a", "b")``).

    Kept because comma lists are the variables' syntax, where pydantic-settings
    would read a list variable as JSON (its decoding is off: ``enable_decoding``).
    A tuple or list passes as it is.
    """
    if not isinstance(value, str):
        return value
    return tuple(part.strip() for part in value.split(",") if part.strip())


def pairs_of(what: str) -> Callable[[Any], Any]:
    """Return a validator that splits ``name=<what>`` pairs, comma-separated, into tuples.

    Kept for the same reason as ``env_list``: ``acme=5,globex=0.5`` is the
    variables' syntax, not JSON. The names are stripped and may not be empty;
    each value is then checked by pydantic as the pair's type says.
    """

    def split(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        pairs = []
        for part in env_list(value):
            name, equals, number = part.partition("=")
            if not equals or not name.strip():  # the message quotes the whole value after it
                alone = part == value.strip()
                raise ValueError(f"not name={what}" if alone else f"{part!r} is not name={what}")
            pairs.append((name.strip(), number))
        return tuple(pairs)

    split.__doc__ = f"Split ``name={what}`` pairs (``pairs_of``)."
    return split


Positive = Annotated[float, Field(gt=0, allow_inf_nan=False), BeforeValidator(env_number)]
"""A finite number above 0 (``nan`` passes every "<= 0" test, ``inf`` turns a wait into a hang)."""
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(env_number)]
"""A whole number above 0."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False), BeforeValidator(env_number)]
"""A duration in seconds: a finite number, 0 or more (0: off, or no wait)."""
Ratio = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), BeforeValidator(env_number)]
"""A share: a number above 0 and at most 1."""
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False), BeforeValidator(env_number)]
"""Calls per second: a finite number, 0 or more (0: no limit)."""
Concurrency = Annotated[int, Field(ge=0, le=MAX_CONCURRENCY), BeforeValidator(env_number)]
"""A cap on calls in flight: a whole number from 0 (no cap) to ``MAX_CONCURRENCY``."""
Flag = Annotated[bool, BeforeValidator(env_bool)]
"""A boolean: 1/0, true/false, yes/no, on/off."""
Names = Annotated[tuple[str, ...], BeforeValidator(env_list)]
"""A comma-separated list; blanks are dropped."""
Rates = Annotated[tuple[tuple[str, Rate], ...], BeforeValidator(pairs_of("rate"))]
"""``name=rate`` pairs, comma-separated (``acme=5,globex=0.5``; ``acme=0``: no limit)."""
Concurrencies = Annotated[tuple[tuple[str, Concurrency], ...], BeforeValidator(pairs_of("cap"))]
"""``name=cap`` pairs, comma-separated (``acme=4,globex=1``; ``acme=0``: no cap)."""
SpanExporter = Annotated[Literal["none", "cloudtrace", "otlp", "noop"], BeforeValidator(env_choice)]
"""Where spans go (any case)."""
MetricsExporter = Annotated[Literal["none", "prometheus", "otlp", "noop"],
                            BeforeValidator(env_choice)]
"""Where metrics go (any case)."""


RULES: dict[str, Callable[[dict[str, Any]], str]] = {
    "greater_than": lambda ctx: ("must be positive" if ctx.get("gt") == 0
                                 else f"must be greater than {ctx.get('gt')}"),
    "greater_than_equal": lambda ctx: (
        "must be 0 or more" if ctx.get("ge") == 0 else f"must be at least {ctx.get('ge')}"),
    "less_than_equal": lambda ctx: f"must be at most {ctx.get('le'):g}",
    "finite_number": lambda ctx: "must be a finite number",
    "int_from_float": lambda ctx: "not a whole number",
    "int_parsing_size": lambda ctx: "too large for a whole number (at most 2**63 - 1)",
    "int_parsing": lambda ctx: "not a whole number",
    "float_parsing": lambda ctx: "not a number",
    "literal_error": lambda ctx: f"is not one of {ctx.get('expected', '')}".replace(" or ", ", "),
    "tuple_type": lambda ctx: "must be a tuple (or a comma-separated string)",
}
"""pydantic's error types → the rule as a ``SettingsError`` says it (from the error's context).

Any other type keeps pydantic's own message, lower-cased: the variable and the
value are named around it all the same."""


def _rule(error: Any) -> str:
    """What a pydantic error says is wrong, in the project's words where it has them."""
    ctx = error.get("ctx") or {}
    if error["type"] == "value_error" and "error" in ctx:
        return str(ctx["error"])  # one of the validators above: its own message
    rule = RULES.get(error["type"])
    return rule(ctx) if rule else str(error["msg"]).lower()


def settings_error(cls: type[EnvSettings], exc: ValidationError,
                   given: Mapping[str, Any]) -> SettingsError:
    """Turn pydantic's ``ValidationError`` into a ``SettingsError`` naming variable, value and rule.

    ``given`` is what the constructor was given (from ``read_env``: the
    variables' text), so the message quotes the whole value, not the piece of
    it pydantic stopped at. A check across fields (``model_validator``) raised
    a ``SettingsError`` of its own, kept as it is.
    """
    problems = []
    for error in exc.errors(include_url=False):
        if not error["loc"]:  # a check across fields: its own SettingsError's message
            problems.append(_rule(error))
            continue
        name = str(error["loc"][0])
        field = cls.model_fields.get(name) or _by_variable(cls, name)
        variable = (_variable(field) if field is not None else None) or name
        value = given.get(name, given.get(variable, error.get("input")))
        if len(error["loc"]) > 1:  # a piece of a list or of a pair: quote it, then the whole
            problems.append(f"{variable}: {_rule(error)}: {error.get('input')!r} in {value!r}")
        else:
            problems.append(f"{variable}: {_rule(error)}: {value!r}")
    return SettingsError("; ".join(problems))


def _variable(field: FieldInfo) -> str | None:
    """The environment variable of a field: its string ``validation_alias``, if it has one."""
    alias = field.validation_alias
    return alias if isinstance(alias, str) else None


def _by_variable(cls: type[EnvSettings], variable: str) -> FieldInfo | None:
    """The field read from ``variable`` (a constructor may be given the variable's name)."""
    return next((field for field in cls.model_fields.values()
                 if _variable(field) == variable), None)


class EnvironSource(PydanticBaseSettingsSource):
    """A pydantic-settings source over a given mapping (default ``os.environ``), one variable
    per field.

    A custom source as pydantic-settings documents them ("Adding sources":
    ``get_field_value`` and ``__call__``), rather than its ``EnvSettingsSource``:
    each field is read from its own variable (its ``validation_alias``) and
    nothing else, where the built-in source would also look for a variable named
    like the field (``lease_seconds``) and reads only ``os.environ``. Empty
    variables count as unset; names are case-sensitive; the text is handed to
    the fields' validators as it is (they read the variables' syntax).
    """

    def __init__(self, settings_cls: type[BaseSettings],
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        self.environ = os.environ if environ is None else environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """The text of the field's own variable (None when unset or empty), keyed by the field."""
        variable = _variable(field)
        value = self.environ.get(variable) if variable else None
        return (None if value == "" else value), field_name, False

    def __call__(self) -> dict[str, Any]:
        """Every field whose variable is set, by field name."""
        found: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, name)
            if value is not None:
                found[key] = value
        return found


class EnvSettings(BaseSettings):
    """Frozen settings whose fields are read from one environment variable each.

    ``MySettings(**fields)`` is the defaults plus what it is given, never the
    process's environment; ``MySettings.read_env(environ)`` reads the variables.
    Both validate, and raise ``SettingsError`` (never pydantic's error); an
    unknown keyword is a ``TypeError``, as it was for the dataclasses these were.
    Assigning to a field raises ``dataclasses.FrozenInstanceError`` (an
    ``AttributeError``); ``replace`` makes a changed copy.
    """

    model_config = SettingsConfigDict(
        frozen=True, case_sensitive=True, env_ignore_empty=True, enable_decoding=False,
        extra="forbid", validate_by_name=True, validate_by_alias=True)

    def __init__(self, **values: Any) -> None:
        cls = type(self)
        unknown = sorted(set(values) - set(cls.model_fields) - {
            variable for field in cls.model_fields.values()
            if (variable := _variable(field)) is not None})
        if unknown:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {unknown[0]!r}")
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise settings_error(cls, exc, values) from None

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the constructor is given: the environment is ``read_env``'s to read."""
        return (init_settings,)

    @classmethod
    def read_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Build the settings from ``environ`` (default ``os.environ``), one variable per field.

        Unset and empty variables keep the field's default; a value that breaks
        its rule raises ``SettingsError`` naming the variable, the value and the rule.
        """
        return cls(**EnvironSource(cls, environ)())

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes``, validated as the constructor validates.

        What ``dataclasses.replace`` did for these settings when they were
        dataclasses: pydantic's ``model_copy(update=...)`` would check nothing.
        """
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **changes})

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


class Settings(EnvSettings):
    """Every knob of the service. Build it with ``Settings.from_env()``."""

    mongodb_uri: str = Field(
        "mongodb://127.0.0.1:27018/", validation_alias="MONGODB_URI",
        description="Any MongoDB: Atlas, a replica set, a local `mongod` or the `localdb` tool "
                    "(`infra/localdb`).")
    mongodb_db: str = Field(
        "partner_events", validation_alias="MONGODB_DB",
        description="The database of the event and guard collections.")
    collection: str = Field(
        "partner_events", validation_alias="EVENTBUS_COLLECTION",
        description="The event collection: one document per idempotency key.")
    service: str = Field(
        "partner-eventbus", validation_alias="EVENTBUS_SERVICE",
        description="The service's name: `service` in log lines, `createdBy` in stored records.")
    lease_seconds: Positive = Field(
        20.0, validation_alias="EVENTBUS_LEASE_SECONDS",
        description="Claim and guard lease, renewed every quarter lease while a handler runs: "
                    "a killed worker's event is free again within one lease.")
    max_attempts: PositiveInt = Field(
        100, validation_alias="EVENTBUS_MAX_ATTEMPTS",
        description="Attempt cap: past it an event is `FAILED` for good and acked.")
    retention_days: Positive = Field(
        30.0, validation_alias="EVENTBUS_RETENTION_DAYS",
        description="How long records are kept: `expire_at` (the TTL index) is `created` plus "
                    "this.")
    project_id: str = Field(
        DEFAULT_PROJECT_ID, validation_alias=PROJECT_VARIABLE,
        description="The Google Cloud project published to (`PUBSUB_EMULATOR_HOST` is read by "
                    "google-cloud-pubsub itself).")
    topic: str = Field(
        DEFAULT_TOPIC, validation_alias=TOPIC_VARIABLE,
        description="The event-bus topic that `publish`, the relay and replays publish to.")
    dead_letter_topic: str = Field(
        "", validation_alias="EVENTBUS_DEAD_LETTER_TOPIC",
        description="The push subscription's dead-letter topic (empty: `<topic>-dlq`); the "
                    "operator tools name the subscription `eventbus dlq drain` pulls after it.")
    max_body_bytes: PositiveInt = Field(
        DEFAULT_MAX_BODY_BYTES, validation_alias="EVENTBUS_MAX_BODY_BYTES",
        description="Larger push bodies are answered 413 (the default, about 13.6 MB, is 10 MB "
                    "of data base64-encoded plus the envelope).")
    store_timeout_ms: PositiveInt = Field(
        5000, validation_alias="EVENTBUS_STORE_TIMEOUT_MS",
        description="MongoDB server-selection and socket timeout: a down store answers 503 well "
                    "inside the ack deadline.")
    auth_enabled: Flag = Field(
        False, validation_alias="EVENTBUS_AUTH",
        description="Verify the OIDC token of every push; on with no audience or no service "
                    "accounts, the service refuses to start.")
    auth_audience: str = Field(
        "", validation_alias="EVENTBUS_AUTH_AUDIENCE",
        description="The `aud` push tokens must carry (required when `EVENTBUS_AUTH` is on).")
    auth_service_accounts: Names = Field(
        (), validation_alias="EVENTBUS_AUTH_SERVICE_ACCOUNTS",
        description="Comma-separated service-account e-mails allowed to push (required when "
                    "`EVENTBUS_AUTH` is on).")
    relay_inline: Flag = Field(
        True, validation_alias="EVENTBUS_RELAY_INLINE",
        description="Publish a handler's children right after its `SUCCESS` (else only the "
                    "`eventbus relay` sweeper does).")
    relay_budget_seconds: Positive = Field(
        2.0, validation_alias="EVENTBUS_RELAY_BUDGET_SECONDS",
        description="The most the inline relay may delay the ack; what is left is the "
                    "sweeper's.")
    relay_parallel: PositiveInt = Field(
        8, validation_alias="EVENTBUS_RELAY_PARALLEL",
        description="How many parents of a pulled batch the inline relay publishes the children "
                    "of at once (each publish waits for Pub/Sub's answer); parents whose children "
                    "share an ordering key go one after another.")
    async_concurrency: PositiveInt = Field(
        100, validation_alias="EVENTBUS_ASYNC_CONCURRENCY",
        description="How many `async def` handlers may await at once in one process (they run "
                    "on the processor's one event loop; a batch's sync handlers keep their "
                    "threads). A waiting coroutine costs kilobytes, a thread megabytes: far above "
                    "`--concurrency`.")
    async_block_warning_seconds: Seconds = Field(
        0.5, validation_alias="EVENTBUS_ASYNC_BLOCK_WARNING_SECONDS",
        description="An async handler that holds the event loop this long (`time.sleep` or a "
                    "sync client inside `async def`) is named in a warning; 0 turns the watchdog "
                    "off.")
    async_stop_grace_seconds: Seconds = Field(
        5.0, validation_alias="EVENTBUS_ASYNC_STOP_GRACE_SECONDS",
        description="At shutdown (a worker's SIGTERM, the ASGI app's lifespan end), async "
                    "handlers still awaiting after this long are cancelled: their events are "
                    "given back (nacked or 503, the attempt not spent) and come back.")
    guard_collection: str = Field(
        "side_effects", validation_alias="EVENTBUS_GUARD_COLLECTION",
        description="The collection of guarded side effects (`context.guard`), one document per "
                    "key.")
    redrive_after_seconds: Positive = Field(
        1200.0, validation_alias="EVENTBUS_REDRIVE_AFTER_SECONDS",
        description="A FAILED-retryable record nothing redelivered for this long is published "
                    "again by the redrive sweeper: twice the push subscription's maximum backoff "
                    "(600 s).")
    retry_after_max_seconds: Positive = Field(
        86400.0, validation_alias="EVENTBUS_RETRY_AFTER_MAX_SECONDS",
        description="The longest wait a `RetryAfter` (a handler's, or a partner's "
                    "`Retry-After`) may ask for; a longer one, a date years ahead, waits this "
                    "long. The shortest is 1 s (negative, NaN, past and unreadable values).")
    order_wait_seconds: Positive = Field(
        1.0, validation_alias="EVENTBUS_ORDER_WAIT_SECONDS",
        description="How long an event of an ordered handler (`ordered_by`) waits for its "
                    "entity while another event of it runs; then it is answered as in progress "
                    "(503, nacked) and comes back later, its attempt not spent. Less than half "
                    "of `EVENTBUS_LEASE_SECONDS`: the claims wait under their lease.")
    redrive_max: PositiveInt = Field(
        20, validation_alias="EVENTBUS_REDRIVE_MAX",
        description="Redrives before an event is given up for good (the attempt cap applies as "
                    "well).")
    redrive_backoff_cap_seconds: Positive = Field(
        6 * 3600.0, validation_alias="EVENTBUS_REDRIVE_BACKOFF_CAP_SECONDS",
        description="The longest wait between two redrives of an event (the wait doubles each "
                    "time).")
    partner_collection: str = Field(
        "partners", validation_alias="EVENTBUS_PARTNER_COLLECTION",
        description="The collection of partner breakers and shared rate buckets "
                    "(`context.partner`).")
    rebuild_collection: str = Field(
        "rebuilds", validation_alias="EVENTBUS_REBUILD_COLLECTION",
        description="The collection of `eventbus rebuild` runs: selection, checkpoint and "
                    "counts.")
    breaker_failures: PositiveInt = Field(
        5, validation_alias="EVENTBUS_BREAKER_FAILURES",
        description="Consecutive transient failures of a partner's calls that open its breaker.")
    breaker_open_seconds: Positive = Field(
        30.0, validation_alias="EVENTBUS_BREAKER_OPEN_SECONDS",
        description="How long an opened breaker refuses calls before one probe goes through; "
                    "doubles while probes fail.")
    breaker_open_cap_seconds: Positive = Field(
        600.0, validation_alias="EVENTBUS_BREAKER_OPEN_CAP_SECONDS",
        description="The longest a breaker stays open between two probes.")
    breaker_probe_seconds: Positive = Field(
        30.0, validation_alias="EVENTBUS_BREAKER_PROBE_SECONDS",
        description="How long a half-open breaker waits for its probe's answer before another "
                    "call may probe (longer than a partner call's deadline).")
    breaker_slow_seconds: Seconds = Field(
        0.0, validation_alias="EVENTBUS_BREAKER_SLOW_SECONDS",
        description="A partner call that takes at least this long (on this process's monotonic "
                    "clock) is slow; enough slow calls open the breaker as failures do (0: off). "
                    "Set it under the partner call's deadline.")
    breaker_slow_share: Ratio = Field(
        0.5, validation_alias="EVENTBUS_BREAKER_SLOW_SHARE",
        description="The share of a partner's recent calls (`EVENTBUS_BREAKER_SLOW_WINDOW`) "
                    "that, slow, opens its breaker (resilience4j's `slowCallRateThreshold`, as a "
                    "share).")
    breaker_slow_min_calls: PositiveInt = Field(
        10, validation_alias="EVENTBUS_BREAKER_SLOW_MIN_CALLS",
        description="How many recent calls a process must have seen before their slow share may "
                    "open the breaker (resilience4j's `minimumNumberOfCalls`).")
    breaker_slow_window: PositiveInt = Field(
        20, validation_alias="EVENTBUS_BREAKER_SLOW_WINDOW",
        description="How many of a partner's latest calls each process keeps to count the slow "
                    "share (a count-based sliding window; at least "
                    "`EVENTBUS_BREAKER_SLOW_MIN_CALLS`).")
    partner_rate: Rate = Field(
        0.0, validation_alias="EVENTBUS_PARTNER_RATE",
        description="Calls per second to each partner, shared by every instance through one "
                    "token bucket in the store, decided on the store's clock: over any span T at "
                    "most rate * T + burst calls go, wherever T starts (0: no limit).")
    partner_rates: Rates = Field(
        (), validation_alias="EVENTBUS_PARTNER_RATES",
        description="Per-partner overrides of `EVENTBUS_PARTNER_RATE`: `name=rate`, "
                    "comma-separated (`name=0`: no limit for that partner).")
    partner_rate_wait_seconds: Positive = Field(
        1.0, validation_alias="EVENTBUS_PARTNER_RATE_WAIT_SECONDS",
        description="The longest a call over its partner's rate waits; a longer wait parks its "
                    "event.")
    partner_concurrency: Concurrency = Field(
        0, validation_alias="EVENTBUS_PARTNER_CONCURRENCY",
        description="A bulkhead: the most calls to one partner in flight at once in this process "
                    "(each process has its own; 0: no cap). A call over it waits up to "
                    "`EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS`, then its event is parked as a "
                    "rate-limited one is (stored, acked, redriven), never answered 503.")
    partner_concurrencies: Concurrencies = Field(
        (), validation_alias="EVENTBUS_PARTNER_CONCURRENCIES",
        description="Per-partner overrides of `EVENTBUS_PARTNER_CONCURRENCY`: `name=cap`, "
                    "comma-separated (`name=0`: no cap for that partner).")
    partner_concurrency_wait_seconds: Seconds = Field(
        0.2, validation_alias="EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS",
        description="The longest a call over its partner's bulkhead waits for a free slot (0: "
                    "none); then its event is parked for "
                    "`EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS`. Less than half of "
                    "`EVENTBUS_LEASE_SECONDS`: the call waits under its claim's lease.")
    partner_concurrency_park_seconds: Positive = Field(
        1.0, validation_alias="EVENTBUS_PARTNER_CONCURRENCY_PARK_SECONDS",
        description="How long an event over its partner's bulkhead is parked: its `redrive_at` "
                    "is this far ahead on the store's clock.")
    partner_burst_seconds: Positive = Field(
        1.0, validation_alias="EVENTBUS_PARTNER_BURST_SECONDS",
        description="A partner's burst: its token bucket holds this many seconds' worth of calls "
                    "(rate * this, at least 1), which may go at once after a quiet spell.")
    log_level: str = Field(
        "INFO", validation_alias="LOG_LEVEL",
        description="The level of the service's log lines (`DEBUG`, `INFO`, `WARNING`, ...).")
    telemetry_exporter: SpanExporter = Field(
        "none", validation_alias="EVENTBUS_TELEMETRY_EXPORTER",
        description="Where spans go: `none` (no spans), `cloudtrace`, `otlp` "
                    "(`OTEL_EXPORTER_OTLP_*`), or `noop` (spans made and dropped, to measure "
                    "their cost). Needs `[telemetry]`.")
    metrics_exporter: MetricsExporter = Field(
        "none", validation_alias="EVENTBUS_METRICS_EXPORTER",
        description="`none`, `prometheus` (a `/metrics` page), `otlp`, or `noop` (recorded, "
                    "dropped).")
    trace_sample_ratio: Ratio = Field(
        0.1, validation_alias="EVENTBUS_TRACE_SAMPLE_RATIO",
        description="Share of traces kept, decided on the trace id, so a cascade is kept or "
                    "dropped whole; the answer to tracing's cost (bench/README.md).")
    metrics_interval_seconds: Positive = Field(
        60.0, validation_alias="EVENTBUS_METRICS_INTERVAL_SECONDS",
        description="How often `otlp` (and `noop`) metrics are exported.")
    trace_libraries: Names = Field(
        ("requests",), validation_alias="EVENTBUS_TRACE_LIBRARIES",
        description="Libraries instrumented when tracing is on: `requests` (partner calls), "
                    "`pymongo` (a span per round trip), `none`.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
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
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``)."""
        return cls.read_env(environ)


def validate_auth(enabled: bool, audience: str, service_accounts: tuple[str, ...]) -> None:
    """Raise ``SettingsError`` when auth is on without an audience or an allow-list.

    Push auth fails closed: with no allowed service account, a token of any
    Google account would pass, so the service must not start that way.
    """
    if not enabled:
        return
    missing = [name for name, empty in (
        ("EVENTBUS_AUTH_SERVICE_ACCOUNTS", not any(a.strip() for a in service_accounts)),
        ("EVENTBUS_AUTH_AUDIENCE", not audience.strip())) if empty]
    if missing:
        raise SettingsError(f"EVENTBUS_AUTH is on but {' and '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} empty: push auth fails "
                            "closed; name the push service account(s) and the audience, "
                            "or turn EVENTBUS_AUTH off")


def variables(cls: type[EnvSettings]) -> dict[str, str]:
    """Where each field of ``cls`` comes from: field → its variable (``validation_alias``).

    Fields without a variable (``AppSettings``' parts) are left out.
    """
    return {name: variable for name, field in cls.model_fields.items()
            if (variable := _variable(field)) is not None}


VARIABLES: dict[str, str] = variables(Settings)
"""Where each field of ``Settings`` comes from: field → environment variable."""


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


def settings_table(cls: type[EnvSettings]) -> str:
    """A Markdown table of the settings of ``cls``: variable, field, default, description.

    Read from the model's fields, in their order; fields without a variable are left out.
    """
    lines = ["| variable | field | default | what it does |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        variable = _variable(field)
        if variable is None:
            continue
        default = field.get_default(call_default_factory=True)
        doc = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{variable}` | `{name}` | {format_default(default)} | {doc} |")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """The configuration reference: every ``Settings`` variable, its default, what it does.

    ``docs/CONFIGURATION.md`` holds this text; ``REGENERATE`` rewrites it.
    """
    return "\n".join([
        "# Configuration",
        "",
        "Generated from the fields of `eventbus.settings.Settings` (each declares its",
        "variable, default and doc once, in its pydantic `Field`, and its rule in its type);",
        "do not edit by hand. Regenerate it with",
        "",
        "```sh",
        REGENERATE,
        "```",
        "",
        "Read once from the environment (`Settings.from_env`, on pydantic-settings): an unset",
        "or empty variable keeps the default; a value that breaks its rule stops the start-up",
        "with a message naming the variable, the value and the rule.",
        "",
        settings_table(Settings),
    ])
