"""Detached background processes: start, recognise (pid + start time), stop, wait.

A pid alone is not an identity: after a reboot or a long time the number can
belong to another program. Every process we record carries its start time
from /proc/<pid>/stat, and we only signal a pid whose start time still matches.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from localdb.errors import LocalDBError

T = TypeVar("T")

# Children started by this Python process, kept so they can be reaped (a test
# session that starts and stops servers must not collect zombies).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Proc:
    """A process identity: pid plus its start time in clock ticks since boot."""

    pid: int
    start_ticks: int


def identify(pid: int) -> Proc | None:
    """The live process with this pid, or None if absent or a zombie."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    # The command name (field 2) may contain spaces and parentheses.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid, int(fields[19]))


def is_running(proc: Proc) -> bool:
    """True when the recorded process still runs (same pid, same start time)."""
    return identify(proc.pid) == proc


def command_name(pid: int) -> str:
    """The short name of a process (/proc/<pid>/comm), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def spawn_detached(
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start `cmd` in its own session with output appended to `log_path`.

    The new session keeps it alive after the CLI exits and out of reach of a
    Ctrl-C sent to the terminal's process group.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%F %T')} starting: {' '.join(cmd)}\n".encode())
        log.flush()
        child = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    _children[child.pid] = child
    proc = identify(child.pid)
    return proc if proc is not None else Proc(child.pid, -1)


def exit_status(proc: Proc) -> int | None:
    """The exit code of a child this process started and that has ended, else None."""
    child = _children.get(proc.pid)
    return None if child is None else child.poll()


def _reap(pid: int) -> None:
    """Collect the exit status of our own child so it does not linger as a zombie."""
    child = _children.get(pid)
    if child is not None:
        child.poll()


def terminate(proc: Proc, sig: signal.Signals, timeout: float, last_resort: signal.Signals) -> bool:
    """Send `sig`, wait up to `timeout` s, then `last_resort` for 5 s; True when gone."""
    for signum, wait in ((sig, timeout), (last_resort, 5.0)):
        if not is_running(proc):
            return True
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            return True
        if wait_for(lambda: not is_running(proc) or None, wait):
            return True
    return not is_running(proc)


def wait_for(check: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T | None:
    """Call `check` until it returns something truthy or `timeout` s pass; that value or None."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# Lines that say why a program failed, preferred over whatever detail follows them.
_FAILURE_WORDS = ("FATAL", "PANIC", "ERROR", "Error", "error")


def last_line(path: Path) -> str:
    """The telling line of a log's tail (last failure line, else last line), or ""."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith("=== ")]
    failures = [ln for ln in lines if any(word in ln for word in _FAILURE_WORDS)]
    return (failures or lines or [""])[-1]


def run_logged(
    cmd: Sequence[str],
    log_path: Path,
    what: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run `cmd` to completion with output appended to `log_path`; LocalDBError on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%F %T')} {what}: {' '.join(cmd)}\n".encode())
        log.flush()
        try:
            done = subprocess.run(
                list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=None if env is None else dict(env), timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise LocalDBError(
                f"{what} did not finish within {timeout:.0f} s; see {log_path}"
            ) from None
        except OSError as exc:
            raise LocalDBError(f"{what} could not run ({exc}); see {log_path}") from None
    if done.returncode != 0:
        raise LocalDBError(
            f"{what} failed (exit {done.returncode}: {last_line(log_path)}); see {log_path}"
        )
