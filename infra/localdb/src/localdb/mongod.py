"""The mongod backend: a throwaway real mongod with its data in a fresh temp directory."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from localdb.config import HOST, Config
from localdb.errors import LocalDBError
from localdb.hooks import Note, Record
from localdb.procs import spawn_detached
from localdb.servers import reuse_or_adopt, wait_answering
from localdb.state import Component, State

READY_TIMEOUT = 30.0


def command(mongod: str, dbpath: Path, port: int) -> list[str]:
    """mongod on loopback only, in the foreground so its pid is ours and output is logged."""
    return [mongod, "--dbpath", str(dbpath), "--port", str(port), "--bind_ip", HOST]


def start(config: Config, current: State, record: Record, note: Note) -> None:
    """Reuse our running mongod, adopt one on the port, or start a new one and wait for it."""
    if config.mongod is None:
        raise LocalDBError("no mongod on PATH; install MongoDB or leave the choice to localdb")
    record(None)
    earlier = current.component("mongod")  # ours and alive, carried over
    existing = reuse_or_adopt("mongod", config, earlier)
    if existing is None or existing is not earlier:
        remove_tmpdir(current.tmpdir)  # its mongod is gone: nobody uses it any more
        current.tmpdir = None
    if existing is not None:
        record(existing)
        return
    _start_new(config, config.mongod, current, record)


def _start_new(config: Config, mongod: str, current: State, record: Record) -> None:
    """A fresh mongod in a fresh temp dir, recorded before we wait for it."""
    current.tmpdir = tempfile.mkdtemp(prefix="localdb-mongod-")
    record(None)
    log = config.log("mongod")
    proc = spawn_detached(command(mongod, Path(current.tmpdir), config.port), log)
    comp = Component("mongod", proc.pid, proc.start_ticks, True, config.port, str(log))
    record(comp)
    wait_answering(comp, config, f"mongod ({mongod})", READY_TIMEOUT)


def remove_tmpdir(tmpdir: str | None) -> None:
    """Delete a throwaway --dbpath (only ever one this module created)."""
    if tmpdir and Path(tmpdir).name.startswith("localdb-mongod-"):
        shutil.rmtree(tmpdir, ignore_errors=True)
