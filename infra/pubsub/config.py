"""What the emulator set-up makes, read from the environment.

Standard library only: ``python -m infra.pubsub check`` and ``ping`` run
before the emulator is up and must not pay for importing the gRPC client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_HOST = "127.0.0.1:8085"
DEFAULT_PROJECT = "local-project"
DEFAULT_TOPIC = "partner-events"
DEFAULT_ENDPOINT = "http://127.0.0.1:8080/"

# Pub/Sub's bounds; the emulator rejects values outside them the same way,
# except that it also accepts ack deadlines below 10 s.
MIN_DELIVERY_ATTEMPTS = 5
MAX_DELIVERY_ATTEMPTS = 100
MAX_BACKOFF_SECONDS = 600.0
MIN_ACK_DEADLINE = 10
MAX_ACK_DEADLINE = 600

# Topic and subscription ids: a letter, then 2-254 of these; never "goog...".
_RESOURCE_ID = re.compile(r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
_SECONDS = re.compile(r"(\d+(?:\.\d+)?)s?")


class ConfigError(ValueError):
    """A setting that is malformed or that Pub/Sub would reject."""


def resource_id(kind: str, value: str) -> str:
    """Return ``value`` when it is a valid topic/subscription id, else raise ConfigError."""
    if not _RESOURCE_ID.fullmatch(value):
        raise ConfigError(
            f"{kind} {value!r} is not a valid Pub/Sub id "
            "(3-255 characters: a letter first, then letters, digits, - _ . ~ + %)"
        )
    return value


def seconds(name: str, value: str) -> float:
    """Parse a duration written as ``10s`` or ``10`` (seconds, decimals allowed)."""
    match = _SECONDS.fullmatch(value.strip())
    if not match:
        raise ConfigError(f"{name}={value!r} is not a duration like 10s")
    return float(match.group(1))


def integer(name: str, value: str) -> int:
    """Parse a whole number of seconds or attempts (``60`` or ``60s``)."""
    number = seconds(name, value)
    if not number.is_integer():
        raise ConfigError(f"{name}={value!r} must be a whole number")
    return int(number)


@dataclass(frozen=True)
class PushPolicy:
    """How a push subscription waits and retries, checked against Pub/Sub's bounds.

    ``max_delivery_attempts`` 0 means no dead-letter policy: Pub/Sub then
    retries until the message's retention (7 days) runs out.
    """

    ack_deadline: int = 60
    min_backoff: float = 10.0
    max_backoff: float = 600.0
    max_delivery_attempts: int = 100

    def __post_init__(self) -> None:
        if not MIN_ACK_DEADLINE <= self.ack_deadline <= MAX_ACK_DEADLINE:
            raise ConfigError(
                f"ack deadline {self.ack_deadline}s is outside "
                f"{MIN_ACK_DEADLINE}..{MAX_ACK_DEADLINE}s"
            )
        if not 0 <= self.min_backoff <= self.max_backoff <= MAX_BACKOFF_SECONDS:
            raise ConfigError(
                f"backoff {self.min_backoff:g}s..{self.max_backoff:g}s must satisfy "
                f"0 <= minimum <= maximum <= {MAX_BACKOFF_SECONDS:g}s"
            )
        attempts = self.max_delivery_attempts
        if attempts and not MIN_DELIVERY_ATTEMPTS <= attempts <= MAX_DELIVERY_ATTEMPTS:
            raise ConfigError(
                f"max delivery attempts {attempts} is outside "
                f"{MIN_DELIVERY_ATTEMPTS}..{MAX_DELIVERY_ATTEMPTS} (0 turns dead-lettering off)"
            )

    @property
    def dead_lettering(self) -> bool:
        """True when messages go to a dead-letter topic after the attempt cap."""
        return self.max_delivery_attempts > 0

    def describe(self) -> str:
        """One short human line: ``ack 60s; backoff 10s..600s; dead letter after 100``."""
        text = f"ack {self.ack_deadline}s; backoff {self.min_backoff:g}s..{self.max_backoff:g}s"
        if self.dead_lettering:
            text += f"; dead letter after {self.max_delivery_attempts} attempts"
        return text


def endpoint_url(value: str) -> str:
    """Return ``value`` when it is an absolute http(s) URL, else raise ConfigError."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"PUSH_ENDPOINT={value!r} is not an http(s) URL")
    return value


def host_port(value: str) -> str:
    """Return ``value`` when it looks like ``host:port``, else raise ConfigError."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"PUBSUB_EMULATOR_HOST={value!r} is not host:port")
    return value


def flag(name: str, value: str) -> bool:
    """Read a yes/no variable: 1/true/yes or 0/false/no."""
    text = value.strip().lower()
    if text not in ("1", "true", "yes", "0", "false", "no"):
        raise ConfigError(f"{name}={value!r} must be 1 or 0 (true or false)")
    return text in ("1", "true", "yes")


@dataclass(frozen=True)
class Layout:
    """The emulator's address and the resources ``ensure`` makes on it."""

    host: str
    project: str
    topic: str
    dead_letter_topic: str
    push_subscription: str
    dead_letter_subscription: str
    endpoint: str
    policy: PushPolicy
    pull_subscription: str = ""
    """The worker's pull subscription on ``topic`` (``eventbus worker``), policies as push."""
    pull_ordered: bool = False
    """Message ordering on the worker's pull subscription (``EVENTBUS_PULL_ORDERED=1``)."""

    def __post_init__(self) -> None:
        names = {
            "PUBSUB_SUBSCRIPTION": self.push_subscription,
            "EVENTBUS_PULL_SUBSCRIPTION": self.pull_subscription,
            "PUBSUB_DEAD_LETTER_SUBSCRIPTION": self.dead_letter_subscription,
        }
        named = [name for name in names.values() if name]
        if len(set(named)) < len(named):
            shown = ", ".join(f"{key}={value}" for key, value in names.items() if value)
            raise ConfigError(f"each subscription needs a name of its own ({shown})")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Layout:
        """Read the layout from environment variables; see pubsub-emulator.sh for the list."""
        topic = resource_id("PUBSUB_TOPIC", env.get("PUBSUB_TOPIC") or DEFAULT_TOPIC)
        dead_letter_topic = resource_id(
            "PUBSUB_DEAD_LETTER_TOPIC", env.get("PUBSUB_DEAD_LETTER_TOPIC") or f"{topic}-dlq"
        )
        policy = PushPolicy(
            ack_deadline=integer("PUSH_ACK_DEADLINE", env.get("PUSH_ACK_DEADLINE") or "60"),
            min_backoff=seconds("PUSH_MIN_BACKOFF", env.get("PUSH_MIN_BACKOFF") or "10s"),
            max_backoff=seconds("PUSH_MAX_BACKOFF", env.get("PUSH_MAX_BACKOFF") or "600s"),
            max_delivery_attempts=integer(
                "PUSH_MAX_DELIVERY_ATTEMPTS", env.get("PUSH_MAX_DELIVERY_ATTEMPTS") or "100"
            ),
        )
        project = env.get("GOOGLE_CLOUD_PROJECT") or DEFAULT_PROJECT
        if "/" in project:
            raise ConfigError(f"GOOGLE_CLOUD_PROJECT={project!r} must be a bare project id")
        return cls(
            host=host_port(env.get("PUBSUB_EMULATOR_HOST") or DEFAULT_HOST),
            project=project,
            topic=topic,
            dead_letter_topic=dead_letter_topic,
            push_subscription=resource_id(
                "PUBSUB_SUBSCRIPTION", env.get("PUBSUB_SUBSCRIPTION") or f"{topic}-push"
            ),
            dead_letter_subscription=resource_id(
                "PUBSUB_DEAD_LETTER_SUBSCRIPTION",
                env.get("PUBSUB_DEAD_LETTER_SUBSCRIPTION") or f"{dead_letter_topic}-pull",
            ),
            endpoint=endpoint_url(env.get("PUSH_ENDPOINT") or DEFAULT_ENDPOINT),
            policy=policy,
            # The worker's own variable (`eventbus worker` reads it too), so one setting
            # names the subscription for both.
            pull_subscription=resource_id(
                "EVENTBUS_PULL_SUBSCRIPTION",
                env.get("EVENTBUS_PULL_SUBSCRIPTION") or f"{topic}-pull",
            ),
            pull_ordered=flag("EVENTBUS_PULL_ORDERED", env.get("EVENTBUS_PULL_ORDERED") or "0"),
        )
