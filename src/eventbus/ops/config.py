"""The operator tools' own settings, read like the service's (``eventbus.settings.read_env``).

| variable | default | meaning |
| --- | --- | --- |
| ``PUBSUB_SUBSCRIPTION`` | ``<topic>-push`` | push subscription (``retries`` shows its policy) |
| ``PUBSUB_DEAD_LETTER_SUBSCRIPTION`` | ``<topic>-dlq-pull`` | what ``dlq drain`` pulls |
| ``EVENTBUS_PULL_SUBSCRIPTION`` | ``<topic>-pull`` | what ``eventbus worker`` pulls |
| ``EVENTBUS_APP`` | empty | ``MODULE:ATTR`` of the service app (its router places messages) |
| ``EVENTBUS_OPERATOR`` | ``$USER`` | who a replay from the command line is recorded as |
| ``EVENTBUS_REPLAY_CONFIRM_ABOVE`` | ``10`` | replays of more events ask for confirmation |
| ``EVENTBUS_CONSOLE_TOKEN`` | random | the local console's access token |
| ``EVENTBUS_CONSOLE_PORT`` | ``8081`` | the local console's port |
| ``EVENTBUS_CONSOLE_AUTH`` | ``local`` | ``local`` (token), ``iap`` or ``oidc`` (signed identity) |
| ``EVENTBUS_CONSOLE_AUDIENCE`` | empty | the identity token's audience (``iap``/``oidc``) |
| ``EVENTBUS_CONSOLE_OPERATORS`` | empty | e-mails allowed in (``iap``/``oidc``); required there |
| ``EVENTBUS_CONSOLE_READ_ONLY`` | ``false`` | hide and refuse replay |
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from eventbus.settings import (
    Parser,
    Settings,
    parse_bool,
    parse_int,
    parse_list,
    parse_str,
    read_env,
)


@dataclasses.dataclass(frozen=True)
class OpsSettings:
    """Settings of the operator commands and the console (next to ``Settings``)."""

    subscription: str = ""
    dead_letter_subscription: str = ""
    pull_subscription: str = ""
    app: str = ""
    operator: str = ""
    replay_confirm_above: int = 10
    console_token: str = ""
    console_port: int = 8081
    console_auth: str = "local"
    console_audience: str = ""
    console_operators: tuple[str, ...] = ()
    console_read_only: bool = False

    @classmethod
    def from_env(cls, settings: Settings,
                 environ: Mapping[str, str] | None = None) -> OpsSettings:
        """Read from ``environ`` (default ``os.environ``); names default from the topic."""
        env = os.environ if environ is None else environ
        read = read_env(cls, SOURCES, env)
        return dataclasses.replace(
            read,
            subscription=read.subscription or f"{settings.topic}-push",
            pull_subscription=read.pull_subscription or f"{settings.topic}-pull",
            dead_letter_subscription=(read.dead_letter_subscription
                                      or f"{settings.dead_letter_topic or settings.topic + '-dlq'}"
                                         "-pull"),
            operator=read.operator or env.get("USER", "") or "operator")


SOURCES: dict[str, tuple[str, Parser]] = {
    "subscription": ("PUBSUB_SUBSCRIPTION", parse_str),
    "dead_letter_subscription": ("PUBSUB_DEAD_LETTER_SUBSCRIPTION", parse_str),
    "pull_subscription": ("EVENTBUS_PULL_SUBSCRIPTION", parse_str),
    "app": ("EVENTBUS_APP", parse_str),
    "operator": ("EVENTBUS_OPERATOR", parse_str),
    "replay_confirm_above": ("EVENTBUS_REPLAY_CONFIRM_ABOVE", parse_int),
    "console_token": ("EVENTBUS_CONSOLE_TOKEN", parse_str),
    "console_port": ("EVENTBUS_CONSOLE_PORT", parse_int),
    "console_auth": ("EVENTBUS_CONSOLE_AUTH", parse_str),
    "console_audience": ("EVENTBUS_CONSOLE_AUDIENCE", parse_str),
    "console_operators": ("EVENTBUS_CONSOLE_OPERATORS", parse_list),
    "console_read_only": ("EVENTBUS_CONSOLE_READ_ONLY", parse_bool),
}
"""Where each field of ``OpsSettings`` comes from: field → (variable, parser)."""
