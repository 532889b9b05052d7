"""Where things live and which server to use, read once from the environment."""

from __future__ import annotations

import enum
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from localdb.errors import LocalDBError

DEFAULT_PORT = 27018
DEFAULT_PG_PORT = 5433
HOST = "127.0.0.1"


class Backend(enum.Enum):
    """Which kind of MongoDB-compatible server serves the URI."""

    EXTERNAL = "external"  # MONGODB_URI is set: someone else runs it
    MONGOD = "mongod"  # a throwaway real mongod found on PATH
    DOCUMENTDB = "documentdb"  # PostgreSQL + DocumentDB in a chroot, behind the gateway


@dataclass(frozen=True)
class Config:
    """Every path, port and choice the manager needs; built by `from_env`.

    Tests use `dataclasses.replace` to get a private run/log directory and port
    while sharing the one provisioned chroot.
    """

    home: Path
    chroot: Path  # the Debian sid chroot holding PostgreSQL 18 and DocumentDB
    logs_dir: Path  # provision.log, postgres.log, gateway.log, mongod.log
    run_dir: Path  # state.json (pids, backend, uri) and the lock
    port: int
    pg_port: int
    mongodb_uri: str | None
    mongod: str | None

    @property
    def local_uri(self) -> str:
        """The URI of the server this manager runs itself."""
        return f"mongodb://{HOST}:{self.port}/"

    @property
    def pg_dsn(self) -> str:
        """libpq DSN of the chroot's PostgreSQL (trust auth on loopback)."""
        return f"host={HOST} port={self.pg_port} user=postgres dbname=postgres"

    def log(self, name: str) -> Path:
        """Path of the log file `name` (e.g. "gateway") in the logs directory."""
        return self.logs_dir / f"{name}.log"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read LOCALDB_HOME, LOCALDB_PORT, LOCALDB_PG_PORT, MONGODB_URI and PATH."""
        env = os.environ if env is None else env
        home = home_dir(env)
        return cls(
            home=home,
            chroot=home / "documentdb-sid",
            logs_dir=home / "logs",
            run_dir=home / "run",
            port=_port(env, "LOCALDB_PORT", DEFAULT_PORT),
            pg_port=_port(env, "LOCALDB_PG_PORT", DEFAULT_PG_PORT),
            mongodb_uri=env.get("MONGODB_URI") or None,
            mongod=shutil.which("mongod", path=env.get("PATH", os.defpath)),
        )


def home_dir(env: Mapping[str, str]) -> Path:
    """`${LOCALDB_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/partner-eventbus}`, made absolute."""
    if env.get("LOCALDB_HOME"):
        return Path(env["LOCALDB_HOME"]).expanduser().absolute()
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return (Path(cache).expanduser() / "partner-eventbus").absolute()


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    """A TCP port from `env[name]`; a bad value is a clear error, not a traceback."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise LocalDBError(f"{name}={raw!r} is not a TCP port; set it to a number like {default}")
    return int(raw)


def choose_backend(config: Config) -> Backend:
    """MONGODB_URI first, then a `mongod` on PATH, else the local DocumentDB."""
    if config.mongodb_uri:
        return Backend.EXTERNAL
    if config.mongod:
        return Backend.MONGOD
    return Backend.DOCUMENTDB
