"""The operator tools' own settings, read like the service's (``eventbus.settings.EnvSettings``).

Each field of ``OpsSettings`` declares its variable and doc once, in its
pydantic ``Field`` (``validation_alias``, ``description``); ``variables()`` and
the "Operator tools" section of ``docs/CONFIGURATION.md`` (``reference_markdown``)
are read from the fields.

The console script first loads a ``.env`` file (``load_env_file``). ``make
run`` writes the local settings (database, emulator, project, topic, console
token) to ``.env`` at the repository root, so every command it prints works
as printed in a fresh shell. The file is looked for in the current directory,
then in its parents up to the first one that holds ``.git``, and read by
python-dotenv (the ``[service]`` extra) without variable interpolation; real
environment variables win over the file. A line python-dotenv cannot parse is
skipped with a warning, never fatal: the file is a convenience, not a
configuration language. The file's values go into the process's environment,
where ``OpsSettings.from_env`` and ``Settings.from_env`` read them as any other
variable. pydantic-settings' own ``.env`` source is not used: it would give its
values to one model only, where these reach both settings and the commands'
subprocesses, and its search for the file does not stop at the repository.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from pydantic import Field

from eventbus import settings
from eventbus.settings import EnvSettings, Flag, Names, PositiveInt, Settings, settings_table


class OpsSettings(EnvSettings):
    """Settings of the operator commands and the console (next to ``Settings``)."""

    subscription: str = Field(
        "", validation_alias="PUBSUB_SUBSCRIPTION",
        description="The push subscription (`retries` shows its policy); empty: `<topic>-push`.")
    dead_letter_subscription: str = Field(
        "", validation_alias="PUBSUB_DEAD_LETTER_SUBSCRIPTION",
        description="What `dlq drain` pulls; empty: `<dead-letter topic>-pull`.")
    pull_subscription: str = Field(
        "", validation_alias="EVENTBUS_PULL_SUBSCRIPTION",
        description="What `eventbus worker` pulls; empty: `<topic>-pull`.")
    app: str = Field(
        "", validation_alias="EVENTBUS_APP",
        description="`MODULE:ATTR` of the service app (its router places messages).")
    operator: str = Field(
        "", validation_alias="EVENTBUS_OPERATOR",
        description="Who a replay from the command line is recorded as; empty: `$USER`.")
    replay_confirm_above: PositiveInt = Field(
        10, validation_alias="EVENTBUS_REPLAY_CONFIRM_ABOVE",
        description="Replays of more events ask for confirmation.")
    console_token: str = Field(
        "", validation_alias="EVENTBUS_CONSOLE_TOKEN",
        description="The local console's access token; empty: a random one.")
    console_port: PositiveInt = Field(
        8081, validation_alias="EVENTBUS_CONSOLE_PORT",
        description="The local console's port.")
    console_auth: str = Field(
        "local", validation_alias="EVENTBUS_CONSOLE_AUTH",
        description="`local` (token), `iap` or `oidc` (signed identity).")
    console_audience: str = Field(
        "", validation_alias="EVENTBUS_CONSOLE_AUDIENCE",
        description="The identity token's audience (`iap`/`oidc`).")
    console_operators: Names = Field(
        (), validation_alias="EVENTBUS_CONSOLE_OPERATORS",
        description="E-mails allowed in (`iap`/`oidc`); required there.")
    console_read_only: Flag = Field(
        False, validation_alias="EVENTBUS_CONSOLE_READ_ONLY",
        description="Hide and refuse replay.")

    @classmethod
    def from_env(cls, settings: Settings,
                 environ: Mapping[str, str] | None = None) -> OpsSettings:
        """Read from ``environ`` (default ``os.environ``); names default from the topic."""
        env = os.environ if environ is None else environ
        read = cls.read_env(env)
        return read.replace(
            subscription=read.subscription or f"{settings.topic}-push",
            pull_subscription=read.pull_subscription or f"{settings.topic}-pull",
            dead_letter_subscription=(read.dead_letter_subscription
                                      or f"{settings.dead_letter_topic or settings.topic + '-dlq'}"
                                         "-pull"),
            operator=read.operator or env.get("USER", "") or "operator")


VARIABLES: dict[str, str] = settings.variables(OpsSettings)
"""Where each field of ``OpsSettings`` comes from: field → environment variable."""


def reference_markdown() -> str:
    """``docs/CONFIGURATION.md``: the service's settings, then the operator tools'."""
    return "\n".join([settings.reference_markdown(), "",
                      "## Operator tools (the `eventbus` console script)", "",
                      "Read by `OpsSettings.from_env` next to the service's settings.", "",
                      settings_table(OpsSettings)])


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
