"""Who uses the local server: one claim per user, in `$LOCALDB_HOME/run/claims/`.

The server is shared by every clone (and test run) that uses one `LOCALDB_HOME`, so
`stop` must not end it while someone else still uses it. Each `start` records a claim:

* a directory claim (the CLI's default: the current directory, e.g. a checkout's root
  for `make run`), held while that directory exists;
* a process claim (the library's default, `--pid` on the CLI: a test run), held
  while that process runs (pid and start time, so a reused pid does not count).

A claim made before the last reboot is released whatever it names. `stop` removes
its caller's claim and stops the server only when no other live claim remains
(`manager.stop`).

A server started by a localdb that kept no claims (an older checkout sharing the
home) has users this one cannot see: `managed` tells the two apart, by a digest of
the state file as this module last saw it written (an older localdb reads and
writes `state.json` in the same format, so the claims live beside it, never in it).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from localdb.errors import LocalDBError
from localdb.procs import Proc, command_name, identify, is_running
from localdb.state import STATE_FILE

CLAIMS_DIR = "claims"
MANAGED_FILE = ".managed"  # a dot file: never read as a claim
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id ("" when the kernel does not say)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Claim:
    """One user of the server: a directory or a process, and what messages call it."""

    owner: str  # e.g. "/work/checkout" or "pid 42 (bash infra/test.sh) in /work/checkout"
    directory: str | None = None  # held while this directory exists
    pid: int | None = None  # held while this process runs (with this start time)
    start_ticks: int | None = None
    boot: str = ""
    since: str = ""

    @property
    def key(self) -> str:
        """The claim's file name: one claim per directory, one per process."""
        if self.pid is not None:
            return f"pid-{self.pid}-{self.start_ticks}.json"
        digest = hashlib.sha256((self.directory or self.owner).encode()).hexdigest()[:16]
        return f"dir-{digest}.json"

    def live(self) -> bool:
        """Whether its user is still there (same boot; the process runs or the directory exists)."""
        if self.boot != boot_id():
            return False
        if self.pid is not None:
            return self.start_ticks is not None and is_running(Proc(self.pid, self.start_ticks))
        return self.directory is not None and Path(self.directory).is_dir()


def for_directory(directory: str | Path) -> Claim:
    """A claim held while `directory` exists (a checkout, for `make run`)."""
    path = Path(directory).expanduser().absolute()
    if not path.is_dir():
        raise LocalDBError(f"--dir {directory}: not a directory; name the checkout that uses "
                           "the server")
    return Claim(str(path), directory=str(path), boot=boot_id(), since=_now())


def for_process(pid: int | None = None) -> Claim:
    """A claim held while process `pid` (default: this one) runs."""
    pid = os.getpid() if pid is None else pid
    proc = identify(pid)
    if proc is None:
        raise LocalDBError(f"--pid {pid}: no such process; name a process that runs")
    return Claim(f"pid {pid} ({_command(pid)}) in {_cwd(pid)}", pid=pid,
                 start_ticks=proc.start_ticks, boot=boot_id(), since=_now())


def add(run_dir: Path, claim: Claim) -> None:
    """Record `claim` (replacing an earlier one of the same user)."""
    folder = run_dir / CLAIMS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{claim.key}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(claim), indent=2) + "\n")
    tmp.replace(folder / claim.key)


def remove(run_dir: Path, claim: Claim) -> bool:
    """Drop `claim`; True when it was recorded."""
    try:
        (run_dir / CLAIMS_DIR / claim.key).unlink()
    except FileNotFoundError:
        return False
    return True


def recorded(run_dir: Path) -> list[Claim]:
    """Every readable claim, live or not, oldest first."""
    found = []
    for path in sorted((run_dir / CLAIMS_DIR).glob("*.json")):
        try:
            found.append(Claim(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # unreadable: nobody can be told apart by it, so it holds nothing
    return sorted(found, key=lambda c: c.since)


def live(run_dir: Path) -> list[Claim]:
    """The claims whose users are still there (read only: `status` may call it unlocked)."""
    return [c for c in recorded(run_dir) if c.live()]


def prune(run_dir: Path) -> list[Claim]:
    """Delete the released claims (and unreadable files); return the live ones."""
    keep = live(run_dir)
    kept = {c.key for c in keep}
    for path in (run_dir / CLAIMS_DIR).glob("*.json"):
        if path.name not in kept:
            path.unlink(missing_ok=True)
    return keep


def clear(run_dir: Path) -> None:
    """Forget every claim and the managed mark (after the server was stopped)."""
    folder = run_dir / CLAIMS_DIR
    for path in [*folder.glob("*.json"), folder / MANAGED_FILE]:
        path.unlink(missing_ok=True)


def mark_managed(run_dir: Path) -> None:
    """Note that the state file as it is now was written by a localdb that keeps claims."""
    folder = run_dir / CLAIMS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANAGED_FILE).write_text(_state_digest(run_dir) + "\n")


def managed(run_dir: Path) -> bool:
    """True when the state file is as a claims-keeping localdb last wrote it."""
    try:
        mark = (run_dir / CLAIMS_DIR / MANAGED_FILE).read_text().strip()
    except OSError:
        return False
    return mark == _state_digest(run_dir)


def describe(found: list[Claim]) -> str:
    """e.g. "/work/a, pid 42 (python -m pytest) in /work/b"."""
    return ", ".join(c.owner for c in found)


def _state_digest(run_dir: Path) -> str:
    try:
        return hashlib.sha256((run_dir / STATE_FILE).read_bytes()).hexdigest()
    except OSError:
        return "no-state"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _command(pid: int, limit: int = 60) -> str:
    """The process's command line, shortened: "bash infra/test.sh"."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    words = [os.path.basename(w) if i == 0 else w
             for i, w in enumerate(raw.decode(errors="replace").split("\0")) if w]
    text = " ".join(words) or command_name(pid) or "?"  # no argv yet: just forked
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return "?"
