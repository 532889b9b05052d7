"""Is a Pub/Sub emulator answering at host:port? (Standard library only: it runs in a poll loop.)"""

from __future__ import annotations

import http.client

# ping's results; pubsub-emulator.sh branches on them as exit codes.
UP, NOTHING_LISTENS, SOMETHING_ELSE = 0, 1, 2


def ping(host: str, timeout: float = 2.0) -> int:
    """Probe ``host`` (host:port) the way the emulator answers: ``GET /`` -> 200 ``Ok``."""
    name, _, port = host.rpartition(":")
    connection = http.client.HTTPConnection(name, int(port), timeout=timeout)
    try:
        connection.connect()
    except OSError:
        return NOTHING_LISTENS
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        body = response.read(64)
    except (OSError, http.client.HTTPException):
        return SOMETHING_ELSE
    finally:
        connection.close()
    return UP if response.status == 200 and body.strip() == b"Ok" else SOMETHING_ELSE
