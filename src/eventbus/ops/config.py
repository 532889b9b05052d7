"""The operator tools' own settings, read like the service's (``eventbus.settings.read_env``).

Each field of ``OpsSettings`` declares its variable, parser and doc once
(``eventbus.settings.setting``); ``SOURCES`` and the "Operator tools" section
of ``docs/CONFIGURATION.md`` (``reference_markdown``) are derived from them.

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

from eventbus import settings
from eventbus.settings import (
    Parser,
    Settings,
    parse_bool,
    parse_int,
    parse_list,
    parse_str,
    read_env,
    setting,
    settings_table,
    sources,
)


@dataclasses.dataclass(frozen=True)
class OpsSettings:
    """Settings of the operator commands and the console (next to ``Settings``)."""

    subscription: str = setting(
        "", env="PUBSUB_SUBSCRIPTION", parse=parse_str,
        doc="The push subscription (`retries` shows its policy); empty: `<topic>-push`.")
    dead_letter_subscription: str = setting(
        "", env="PUBSUB_DEAD_LETTER_SUBSCRIPTION", parse=parse_str,
        doc="What `dlq drain` pulls; empty: `<dead-letter topic>-pull`.")
    pull_subscription: str = setting(
        "", env="EVENTBUS_PULL_SUBSCRIPTION", parse=parse_str,
        doc="What `eventbus worker` pulls; empty: `<topic>-pull`.")
    app: str = setting(
        "", env="EVENTBUS_APP", parse=parse_str,
        doc="`MODULE:ATTR` of the service app (its router places messages).")
    operator: str = setting(
        "", env="EVENTBUS_OPERATOR", parse=parse_str,
        doc="Who a replay from the command line is recorded as; empty: `$USER`.")
    replay_confirm_above: int = setting(
        10, env="EVENTBUS_REPLAY_CONFIRM_ABOVE", parse=parse_int,
        doc="Replays of more events ask for confirmation.")
    console_token: str = setting(
        "", env="EVENTBUS_CONSOLE_TOKEN", parse=parse_str,
        doc="The local console's access token; empty: a random one.")
    console_port: int = setting(
        8081, env="EVENTBUS_CONSOLE_PORT", parse=parse_int,
        doc="The local console's port.")
    console_auth: str = setting(
        "local", env="EVENTBUS_CONSOLE_AUTH", parse=parse_str,
        doc="`local` (token), `iap` or `oidc` (signed identity).")
    console_audience: str = setting(
        "", env="EVENTBUS_CONSOLE_AUDIENCE", parse=parse_str,
        doc="The identity token's audience (`iap`/`oidc`).")
    console_operators: tuple[str, ...] = setting(
        (), env="EVENTBUS_CONSOLE_OPERATORS", parse=parse_list,
        doc="E-mails allowed in (`iap`/`oidc`); required there.")
    console_read_only: bool = setting(
        False, env="EVENTBUS_CONSOLE_READ_ONLY", parse=parse_bool,
        doc="Hide and refuse replay.")

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


SOURCES: dict[str, tuple[str, Parser]] = sources(OpsSettings)
"""Where each field of ``OpsSettings`` comes from: field → (variable, parser), from its metadata."""


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
