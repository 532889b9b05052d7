"""What the MongoDB-speaking servers (gateway, mongod) have in common.

Before starting one we look at its port: our own live process is reused, a
server someone else started that answers `ping` is used but never stopped,
and any other program on the port is an error.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

from localdb.config import Config
from localdb.errors import LocalDBError
from localdb.probes import mongo_ping
from localdb.procs import exit_status, identify, last_line, port_open, terminate, wait_for
from localdb.state import Component

LISTEN = "0A"  # TCP state code of a listening socket in /proc/net/tcp


def reuse_or_adopt(name: str, config: Config, previous: Component | None) -> Component | None:
    """The server already answering on config.port, or None when the port is free."""
    if previous is not None and previous.running():
        if mongo_ping(config.local_uri) is None:
            return previous
        raise LocalDBError(f"our {name} (pid {previous.pid}) runs but does not answer ping on "
                           f"port {config.port}; see {previous.log}, then run "
                           "`python -m localdb stop` and start again")
    if not port_open(config.port):
        return None
    if mongo_ping(config.local_uri) is not None:
        raise LocalDBError(
            f"port {config.port} is taken by a program that does not answer MongoDB ping; "
            "stop it or set LOCALDB_PORT to a free port"
        )
    return adopted(name, config.port)


def ping_local(uri: str, timeout: float = 2.0) -> str | None:
    """Like mongo_ping, but says at once when nothing listens (pymongo would retry)."""
    port = urlsplit(uri).port
    if port is not None and not port_open(port):
        return f"nothing listens on 127.0.0.1:{port}"
    return mongo_ping(uri, timeout)


def adopted(name: str, port: int) -> Component:
    """A component for a server someone else started (owned=False: stop leaves it alone)."""
    pid = listener_pid(port)
    proc = identify(pid) if pid else None
    ticks = proc.start_ticks if proc else -1
    return Component(name, pid or 0, ticks, owned=False, port=port, log="")


def wait_answering(comp: Component, config: Config, what: str, timeout: float) -> None:
    """Wait until `ping` answers at config.local_uri; fail early if the process dies."""
    log = Path(comp.log)
    last_error: list[str | None] = [None]

    def answered() -> bool:
        if not comp.running():
            code = exit_status(comp.proc)
            raise LocalDBError(f"{what} exited at startup (exit {code}: {last_line(log)}); "
                               f"see {log}")
        last_error[0] = mongo_ping(config.local_uri, timeout=1.0)
        return last_error[0] is None

    if not wait_for(answered, timeout, interval=0.2):
        raise LocalDBError(f"{what} did not answer ping on port {config.port} within "
                           f"{timeout:.0f} s ({last_error[0]}); see {log}")


def stop_process(comp: Component, what: str) -> None:
    """SIGTERM, then SIGKILL after 10 s; LocalDBError if it still lives."""
    if not terminate(comp.proc, signal.SIGTERM, 10.0, signal.SIGKILL):
        raise LocalDBError(f"{what} (pid {comp.pid}) did not stop; kill it by hand")


def listener_pid(port: int) -> int | None:
    """The pid listening on TCP `port` (any address), found through socket inodes."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit() and _has_socket(proc_dir, inodes):
            return int(proc_dir.name)
    return None


def _listening_inodes(port: int) -> set[str]:
    """Inodes of sockets listening on `port`, from /proc/net/tcp and tcp6."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _has_socket(proc_dir: Path, inodes: set[str]) -> bool:
    """True when the process holds one of the socket `inodes` open."""
    try:
        fds = list((proc_dir / "fd").iterdir())
    except OSError:  # gone, or not ours to read
        return False
    return any(_socket_inode(fd) in inodes for fd in fds)


def _socket_inode(fd: Path) -> str:
    """The inode of a socket file descriptor link ("socket:[123]"), else ""."""
    try:
        link = os.readlink(fd)
    except OSError:  # closed meanwhile (e.g. the directory listing's own descriptor)
        return ""
    return link[8:-1] if link.startswith("socket:[") else ""
