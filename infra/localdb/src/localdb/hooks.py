"""Callback types shared by the backends."""

from __future__ import annotations

from collections.abc import Callable

from localdb.state import Component

# Progress for humans ("creating the chroot, about 2 min"); the CLI prints it to stderr.
Note = Callable[[str], None]
# Add a started component (or None: just save) to the current state and save it at once,
# so that a failure later in `start` still leaves a state `stop` can clean up.
Record = Callable[[Component | None], None]
