"""PostgreSQL + DocumentDB inside the chroot: find, start, wait for, extend, stop."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psycopg

from localdb import chroot
from localdb.config import Config
from localdb.errors import LocalDBError
from localdb.probes import pg_error, pg_query
from localdb.procs import (
    Proc,
    command_name,
    exit_status,
    identify,
    last_line,
    port_open,
    spawn_detached,
    terminate,
    wait_for,
)
from localdb.provision import PG_BIN, PGDATA, pgdata
from localdb.state import Component

READY_TIMEOUT = 30.0
EXTENSION_TIMEOUT = 300.0  # the first CREATE EXTENSION pulls in postgis etc.
STOP_TIMEOUT = 30.0
# Each gateway client connection holds a PostgreSQL backend; the default 100 runs out
# when a test session, a bench and a stray gateway share the server.
MAX_CONNECTIONS = 300
# Autovacuum looks for work every naptime (default 1 min). A collection that
# grows by thousands of documents a minute then has no planner statistics for
# its first minute and lags behind afterwards; without them the engine ANDs
# every equality's index (walking the `event_status` index for an owner-checked
# finish) and a claim's cost doubles and keeps growing with the data
# (infra/localdb/bench/growth.py). Every 2 s keeps statistics current from the
# first thousand documents on; one launcher wake-up on a few tables is cheap,
# and each ANALYZE samples at most 30,000 rows (a few ms to ~100 ms).
AUTOVACUUM_NAPTIME = "2s"


def running_postmaster(root: Path) -> tuple[Proc, int] | None:
    """The live postmaster of the chroot's cluster and its port, from postmaster.pid."""
    try:
        lines = (pgdata(root) / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    pid = int(lines[0])
    proc = identify(pid)
    # A stale file's pid may now be any process: require postgres, rooted in the chroot.
    if proc is None or command_name(pid) != "postgres" or \
            chroot.root_of(pid) != str(root.resolve()):
        return None
    return proc, int(lines[3])


def start(config: Config, previous: Component | None) -> Component:
    """Use the running postmaster or start one; returns it (call `wait_ready` next)."""
    found = running_postmaster(config.chroot)
    if found is not None:
        return _existing(config, previous, *found)
    if port_open(config.pg_port):
        raise LocalDBError(
            f"port {config.pg_port} is taken by a program other than the chroot's PostgreSQL; "
            "stop it or set LOCALDB_PG_PORT to a free port"
        )
    _remove_stale_locks(config)
    log = config.log("postgres")
    proc = spawn_detached(_command(config), log, env=_env())
    return Component("postgres", proc.pid, proc.start_ticks, True, config.pg_port, str(log))


def _existing(config: Config, previous: Component | None, proc: Proc, port: int) -> Component:
    """The already-running postmaster; owned only if our state says we started it."""
    if port != config.pg_port:
        raise LocalDBError(
            f"the chroot's PostgreSQL already runs on port {port} (pid {proc.pid}), not "
            f"LOCALDB_PG_PORT={config.pg_port}; use that port or stop it (kill -INT {proc.pid})"
        )
    owned = previous is not None and previous.owned and previous.proc == proc
    return Component("postgres", proc.pid, proc.start_ticks, owned, port, log_of(proc.pid, config))


def log_of(pid: int, config: Config) -> str:
    """Where a running postmaster writes (its stderr), else our postgres.log."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return str(config.log("postgres"))
    return target if target.startswith("/") else str(config.log("postgres"))


def _command(config: Config) -> list[str]:
    """postgres in the foreground (so stderr goes to our log) as the chroot's postgres user."""
    argv = [f"{PG_BIN}/postgres", "-D", PGDATA, "-p", str(config.pg_port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"max_connections={MAX_CONNECTIONS}",
            "-c", f"autovacuum_naptime={AUTOVACUUM_NAPTIME}"]
    return chroot.command(config.chroot, argv, user="postgres")


def _env() -> dict[str, str]:
    """The chroot environment with the postgres user's home."""
    return {**chroot.CHROOT_ENV, "HOME": "/var/lib/postgresql"}


def _remove_stale_locks(config: Config) -> None:
    """Delete lock files left by a postmaster that no longer runs (e.g. after a reboot).

    PostgreSQL refuses to start if the pid in them now belongs to another process.
    """
    socket_lock = config.chroot / f"var/tmp/.s.PGSQL.{config.pg_port}.lock"
    for lock in (pgdata(config.chroot) / "postmaster.pid", socket_lock):
        lock.unlink(missing_ok=True)


def wait_ready(config: Config, comp: Component, timeout: float = READY_TIMEOUT) -> None:
    """Wait until PostgreSQL accepts connections; fail early if our postmaster dies."""
    log = Path(comp.log)
    last_error: list[str | None] = [None]

    def ready() -> bool:
        if comp.owned and not comp.running():
            code = exit_status(comp.proc)
            raise LocalDBError(f"PostgreSQL exited at startup (exit {code}: {last_line(log)}); "
                               f"see {log}")
        last_error[0] = pg_error(config.pg_dsn)
        if last_error[0] and "too many clients" in last_error[0]:
            raise LocalDBError(f"PostgreSQL on port {config.pg_port} has no free connection "
                               "(max_connections reached); stop idle clients such as stray "
                               f"gateways (ss -tnp | grep :{config.pg_port}) and retry")
        return last_error[0] is None

    if not wait_for(ready, timeout, interval=0.2):
        raise LocalDBError(f"PostgreSQL did not accept connections on port {config.pg_port} "
                           f"within {timeout:.0f} s ({last_error[0]}); see {log}")


def ensure_extension(config: Config, log: str) -> None:
    """CREATE EXTENSION documentdb unless it exists (the first time takes a few seconds)."""
    try:
        if pg_query(config.pg_dsn, "SELECT 1 FROM pg_extension WHERE extname = 'documentdb'"):
            return
        pg_query(config.pg_dsn, "CREATE EXTENSION IF NOT EXISTS documentdb CASCADE",
                 timeout=EXTENSION_TIMEOUT)
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LocalDBError(f"creating the documentdb extension failed ({detail}); see {log}") \
            from None


def stop(comp: Component) -> None:
    """Fast shutdown (SIGINT: roll back, checkpoint, exit); SIGQUIT if it hangs."""
    if not terminate(comp.proc, signal.SIGINT, STOP_TIMEOUT, signal.SIGQUIT):
        raise LocalDBError(f"PostgreSQL (pid {comp.pid}) did not stop within {STOP_TIMEOUT:.0f} "
                           f"s; see {comp.log}")
