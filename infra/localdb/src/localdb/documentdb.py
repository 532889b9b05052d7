"""The DocumentDB backend: provision the chroot, run PostgreSQL, put the gateway in front."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from localdb import chroot, postgres, provision
from localdb.config import HOST, Config
from localdb.hooks import Note, Record
from localdb.procs import spawn_detached
from localdb.servers import reuse_or_adopt, wait_answering
from localdb.state import Component, State

# The directory `localdb` was imported from (src/ of a checkout, or site-packages).
PACKAGE_PARENT = Path(__file__).resolve().parents[1]
GATEWAY_TIMEOUT = 20.0


def start(config: Config, current: State, record: Record, note: Note) -> None:
    """Bring up PostgreSQL (provisioning first if needed) and the gateway; record each.

    `current` holds what an earlier start left running that is ours: it is reused.
    """
    provision.require_root()
    record(None)
    provision.ensure_base(config, note)
    current.mounts += chroot.ensure_mounts(config.chroot)
    record(None)
    provision.ensure_postgres(config, note)
    pg = postgres.start(config, current.component("postgres"))
    record(pg)
    postgres.wait_ready(config, pg)
    postgres.ensure_extension(config, pg.log)
    provision.mark_provisioned(config.chroot)
    _start_gateway(config, current.component("gateway"), record)


def gateway_command(config: Config) -> list[str]:
    """The gateway's command line (same interpreter, so the same venv)."""
    return [sys.executable, "-m", "localdb.gateway",
            "--listen", f"{HOST}:{config.port}", "--pg", config.pg_dsn]


def _start_gateway(config: Config, previous: Component | None, record: Record) -> None:
    """Reuse or adopt a gateway already on the port, or start ours and wait for ping."""
    existing = reuse_or_adopt("gateway", config, previous)
    if existing is not None:
        record(existing)
        return
    log = config.log("gateway")
    # PYTHONPATH: `-m localdb.gateway` runs the code this process runs, installed or not.
    env = {**os.environ, "PYTHONPATH": with_package(os.environ.get("PYTHONPATH", ""))}
    proc = spawn_detached(gateway_command(config), log, env=env, cwd=config.logs_dir)
    gateway = Component("gateway", proc.pid, proc.start_ticks, True, config.port, str(log))
    record(gateway)
    wait_answering(gateway, config, "the gateway", GATEWAY_TIMEOUT)


def with_package(pythonpath: str) -> str:
    """PYTHONPATH with the directory holding this `localdb` package first."""
    rest = [p for p in pythonpath.split(os.pathsep) if p and p != str(PACKAGE_PARENT)]
    return os.pathsep.join([str(PACKAGE_PARENT), *rest])
