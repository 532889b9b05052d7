"""What this manager started, kept in `$LOCALDB_HOME/run/state.json`, and the run lock.

`stop` acts only on what the state file says this manager started ("owned"),
so a server someone else started is never killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localdb.errors import LocalDBError
from localdb.procs import Proc, is_running

STATE_FILE = "state.json"
LOCK_FILE = "lock"


@dataclass
class Component:
    """One server process: the gateway, PostgreSQL or mongod."""

    name: str
    pid: int
    start_ticks: int
    owned: bool  # True only when this manager started it
    port: int
    log: str

    @property
    def proc(self) -> Proc:
        """The recorded process identity."""
        return Proc(self.pid, self.start_ticks)

    def running(self) -> bool:
        """True while the recorded process is alive (pid and start time match)."""
        return is_running(self.proc)


@dataclass
class State:
    """The running local server: backend, URI, processes, mounts, temp dirs."""

    backend: str
    uri: str
    components: list[Component] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)  # mount points we mounted
    tmpdir: str | None = None  # mongod's throwaway --dbpath

    def component(self, name: str) -> Component | None:
        """The component called `name`, if recorded."""
        return next((c for c in self.components if c.name == name), None)


def load(run_dir: Path) -> State | None:
    """The saved state, or None when there is none (or it is unreadable)."""
    try:
        raw = json.loads((run_dir / STATE_FILE).read_text())
        comps = [Component(**c) for c in raw.pop("components", [])]
        return State(components=comps, **raw)
    except (OSError, ValueError, TypeError):
        return None


def save(run_dir: Path, state: State) -> None:
    """Write the state atomically (a reader never sees half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(run_dir / STATE_FILE)


def clear(run_dir: Path) -> None:
    """Forget the state (after everything owned has been stopped)."""
    (run_dir / STATE_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def locked(run_dir: Path, timeout: float) -> Iterator[None]:
    """Hold the run lock so two `start`/`stop` calls never interleave.

    The timeout is long enough for another process's first provisioning.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = (run_dir / LOCK_FILE).open("a+")
    except OSError as exc:
        raise LocalDBError(f"cannot write {run_dir} ({exc.strerror}); set LOCALDB_HOME to a "
                           "directory you can write") from None
    with lock as f:
        _acquire(f.fileno(), timeout, run_dir / LOCK_FILE)
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _acquire(fd: int, timeout: float, path: Path) -> None:
    """flock with a deadline, since flock itself can wait forever."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = path.read_text().strip() or "?"
                raise LocalDBError(
                    f"another localdb start/stop (pid {holder}) held {path} for {timeout:.0f} s; "
                    "wait for it or end that process"
                ) from None
            time.sleep(0.2)
