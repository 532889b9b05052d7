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

The console script first loads a ``.env`` file (``load_env_file``). ``make
run`` writes the local settings (database, emulator, project, topic, console
token) to ``.env`` at the repository root, so every command it prints works
as printed in a fresh shell. The file is looked for in the current directory,
then in its parents up to the first one that holds ``.git``, and read by
python-dotenv (the ``[service]`` extra) without variable interpolation; real
environment variables win over the file. A line python-dotenv cannot parse is
skipped with a warning, never fatal: the file is a convenience, not a
configuration language.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

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


ENV_FILE = ".env"
# Bigger than any settings file; a larger one is not ours and is ignored.
MAX_ENV_BYTES = 64 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_file_values(text: str) -> dict[str, str]:
    """Return the variables of a ``.env`` text, read by python-dotenv with no interpolation.

    Later lines override earlier ones. Left out: what python-dotenv cannot
    parse (it logs a warning naming the line), a name that is not an
    identifier, a name without ``=``, and a value holding NUL (which no
    environment can carry).
    """
    from dotenv import dotenv_values

    values = dotenv_values(stream=io.StringIO(text), interpolate=False)
    return {name: value for name, value in values.items()
            if value is not None and _NAME.fullmatch(name) and "\x00" not in value}


def find_env_file(start: Path | None = None) -> Path | None:
    """Return the ``.env`` of ``start`` (default: the current directory) or of its parents.

    The search stops at the first directory that holds ``.git``: a ``.env``
    above the repository belongs to something else.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / ENV_FILE
        if candidate.is_file():
            return candidate
        if (folder / ".git").exists():
            return None
    return None


def load_env_file(start: Path | None = None,
                  environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Set the variables of the nearest ``.env`` that are not set yet; return its path.

    None when there is no such file, it cannot be read, it is larger than
    ``MAX_ENV_BYTES``, or python-dotenv is not installed.
    """
    path = find_env_file(start)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_ENV_BYTES:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
        values = env_file_values(text)
    except OSError:
        return None
    except ImportError:  # python-dotenv comes with the [service] extra
        return None
    env = os.environ if environ is None else environ
    for name, value in values.items():
        env.setdefault(name, value)  # the real environment wins
    return path
