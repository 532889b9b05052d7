"""Count the commands a block of code sends to MongoDB: the store's round-trip budget.

pymongo publishes a ``CommandStartedEvent`` on the thread that runs the
operation, so a thread-local counter sees exactly the commands of the code
measured on that thread, even while other threads use the same client.

    with store.round_trips.measure() as sent:
        store.claim(...)
    assert sent.count == 1
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

from pymongo import monitoring

# Connection handshakes, server monitoring and session cleanup are the
# driver's own traffic, not round trips the code under measure asked for.
IGNORED_COMMANDS = frozenset({"hello", "isMaster", "ismaster", "endSessions"})


# eq=False: measurements are removed by identity, and two may hold equal lists.
@dataclasses.dataclass(eq=False)
class Measurement:
    """The commands sent on one thread inside one ``measure()`` block."""

    commands: list[str] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """The number of commands sent so far."""
        return len(self.commands)


class RoundTrips(monitoring.CommandListener):
    """A command listener that counts, per thread, the commands sent inside ``measure()``."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _active(self) -> list[Measurement]:
        active: list[Measurement] | None = getattr(self._local, "active", None)
        if active is None:
            active = self._local.active = []
        return active

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Yield a ``Measurement`` of the commands this thread sends inside the block.

        Blocks may nest; a command counts in every block open on the thread.
        """
        measurement = Measurement()
        active = self._active()
        active.append(measurement)
        try:
            yield measurement
        finally:
            active.remove(measurement)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        """Count ``event`` in every measurement open on this thread."""
        if event.command_name in IGNORED_COMMANDS:
            return
        for measurement in self._active():
            measurement.commands.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        """Ignore: a command counts when it is sent, whatever its result."""

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        """Ignore: a command counts when it is sent, whatever its result."""
