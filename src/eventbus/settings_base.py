"""What the settings share with the paths that run without pydantic (standard library only).

``eventbus.settings`` holds the service's settings as pydantic-settings
models; pydantic comes with the ``[service]`` extra. A publisher-only install
(``from eventbus import publish``) has google-cloud-pubsub and nothing else,
so what that path needs of the settings lives here: the error type, Pub/Sub's
size limit, and the publisher's two variables (``publish_target``), read
directly with the same names, defaults and empty-means-default rule as
``Settings.project_id`` and ``Settings.topic``, which take their defaults from
here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Pub/Sub caps message data at 10 MB; the push envelope base64-encodes it
# (4/3) and adds metadata, so this is the largest body a real push can have.
PUBSUB_MAX_DATA_BYTES = 10 * 1000 * 1000
"""The largest message data Pub/Sub takes, in bytes."""
DEFAULT_MAX_BODY_BYTES = PUBSUB_MAX_DATA_BYTES * 4 // 3 + 256 * 1024
"""The default of ``EVENTBUS_MAX_BODY_BYTES``: the largest body a real push can have."""

PROJECT_VARIABLE = "GOOGLE_CLOUD_PROJECT"
"""The variable of the Google Cloud project published to (``Settings.project_id``)."""
DEFAULT_PROJECT_ID = "local-project"
"""The project when ``GOOGLE_CLOUD_PROJECT`` is unset or empty."""
TOPIC_VARIABLE = "PUBSUB_TOPIC"
"""The variable of the event-bus topic (``Settings.topic``)."""
DEFAULT_TOPIC = "partner-events"
"""The topic when ``PUBSUB_TOPIC`` is unset or empty."""


class SettingsError(ValueError):
    """Raised when an environment variable holds a value that cannot be used.

    The message names the variable, the value and the rule it breaks.
    """


def publish_target(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The project and topic ``publish()`` sends to, from ``environ`` (default ``os.environ``).

    An unset or empty variable keeps its default, as in ``Settings.from_env``;
    no other variable is read, so a publisher needs neither pydantic nor the
    service's settings.
    """
    env = os.environ if environ is None else environ
    return (env.get(PROJECT_VARIABLE) or DEFAULT_PROJECT_ID,
            env.get(TOPIC_VARIABLE) or DEFAULT_TOPIC)
