"""Provisioning of the DocumentDB chroot: Debian sid + postgresql-18-documentdb + a cluster.

Every step checks whether its result already exists and returns at once if so,
so a provisioned machine pays only a few stat() calls. The slow steps write
their output to `$LOCALDB_HOME/logs/provision.log`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from localdb import chroot
from localdb.config import Config
from localdb.errors import LocalDBError
from localdb.hooks import Note
from localdb.procs import run_logged

MIRROR = "http://deb.debian.org/debian"
# sid's Release file is often past its Valid-Until date; the packages are still fine.
APT = ("apt-get", "-q", "-o", "Acquire::Check-Valid-Until=false")
PACKAGE = "postgresql-18-documentdb"
PG_BIN = "/usr/lib/postgresql/18/bin"
EXTENSION_LIB = "usr/lib/postgresql/18/lib/pg_documentdb.so"
PGDATA = "/var/tmp/pgdata"  # inside the chroot; the spike's path, so its cluster is reused
MARKER = ".localdb-provisioned"
CONF_BLOCK = """
# --- added by localdb (port and listen address are passed on the command line)
unix_socket_directories = '/var/tmp'
shared_preload_libraries = 'pg_cron,pg_documentdb_core,pg_documentdb'
cron.database_name = 'postgres'
synchronous_commit = off
"""



def require_root() -> None:
    """The chroot needs mount(2) and chroot(2), so only root can run it."""
    if os.geteuid() != 0:
        raise LocalDBError(
            "the local DocumentDB needs root (it uses chroot and mount); run as root, "
            "or set MONGODB_URI to a MongoDB you can reach"
        )


def pgdata(root: Path) -> Path:
    """The cluster's data directory as seen from the host."""
    return root / PGDATA.lstrip("/")


def is_provisioned(root: Path) -> bool:
    """True when the marker and the files it vouches for are all there."""
    return (root / MARKER).exists() and base_complete(root) and postgres_installed(root) \
        and cluster_ready(root)


def base_complete(root: Path) -> bool:
    """debootstrap finished: apt exists and its scratch directory is gone."""
    return (root / "usr/bin/apt-get").exists() and not (root / "debootstrap").exists()


def postgres_installed(root: Path) -> bool:
    """The DocumentDB extension's library is in place."""
    return (root / EXTENSION_LIB).exists()


def cluster_ready(root: Path) -> bool:
    """initdb completed and our settings were appended (they come last)."""
    conf = pgdata(root) / "postgresql.conf"
    return (pgdata(root) / "PG_VERSION").exists() and conf.exists() \
        and "pg_documentdb" in conf.read_text(errors="replace")


def ensure_base(config: Config, note: Note) -> None:
    """Debootstrap a minimal sid into the chroot directory if it is not there yet."""
    root = config.chroot
    if base_complete(root):
        return
    if root.exists():
        raise LocalDBError(
            f"{root} is an incomplete chroot (interrupted debootstrap?); unmount anything under "
            f"it (`umount {root}/dev {root}/proc`), remove it, and start again"
        )
    note(f"creating the Debian sid chroot (about 1-2 min); log: {config.log('provision')}")
    ensure_debootstrap(config)
    _bootstrap(root, config.log("provision"))


def ensure_debootstrap(config: Config) -> None:
    """Install debootstrap on the host with apt-get when it is missing."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    if shutil.which("debootstrap", path=path):
        return
    log = config.log("provision")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_logged([*APT, "update"], log, "apt-get update (host, for debootstrap)", 600, env)
    run_logged([*APT, "install", "-y", "debootstrap"], log, "installing debootstrap", 600, env)


def _bootstrap(root: Path, log: Path) -> None:
    """Debootstrap into a scratch directory and rename it, so `root` is never half-made."""
    scratch = root.with_name(root.name + ".partial")
    if scratch.exists():
        if chroot.mounts_under(scratch):
            raise LocalDBError(f"{scratch} still has mounts ({chroot.mounts_under(scratch)}); "
                               "unmount them and start again")
        shutil.rmtree(scratch)
    root.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["debootstrap", "--variant=minbase", "sid", str(scratch), MIRROR]
    run_logged(cmd, log, "debootstrap of Debian sid", 1800)
    scratch.rename(root)


def ensure_postgres(config: Config, note: Note) -> None:
    """Install the DocumentDB package and create the cluster, each only if missing.

    Needs the chroot's /dev and /proc mounted.
    """
    root, log = config.chroot, config.log("provision")
    if not postgres_installed(root):
        note(f"installing {PACKAGE} in the chroot (about 1-3 min); log: {log}")
        _install(root, log)
    if not cluster_ready(root):
        _init_cluster(root, log)


def _install(root: Path, log: Path) -> None:
    """apt-get install the extension (finishing any interrupted dpkg run first)."""
    env = chroot.CHROOT_ENV
    run_logged(chroot.command(root, ["dpkg", "--configure", "-a"]), log, "dpkg --configure -a",
               900, env)
    run_logged(chroot.command(root, [*APT, "update"]), log, "apt-get update (chroot)", 900, env)
    install = [*APT, "install", "-y", "--no-install-recommends", PACKAGE]
    run_logged(chroot.command(root, install), log, f"apt-get install {PACKAGE}", 2400, env)


def _init_cluster(root: Path, log: Path) -> None:
    """initdb a cluster unless one exists (never delete data), then append our settings."""
    data = pgdata(root)
    if not (data / "PG_VERSION").exists():
        _initdb(root, data, log)
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(CONF_BLOCK)


def _initdb(root: Path, data: Path, log: Path) -> None:
    """Run initdb (trust auth on loopback, UTF-8) as the chroot's postgres user."""
    if data.exists():
        shutil.rmtree(data)  # left by an initdb killed before PG_VERSION: holds no data
    uid, gid = chroot.user_ids(root, "postgres")
    data.mkdir(mode=0o700, parents=True)
    os.chown(data, uid, gid)
    initdb = [f"{PG_BIN}/initdb", "-D", PGDATA, "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--locale=C.UTF-8"]
    env = {**chroot.CHROOT_ENV, "HOME": "/var/lib/postgresql"}
    run_logged(chroot.command(root, initdb, user="postgres"), log, "initdb", 300, env)


def mark_provisioned(root: Path) -> None:
    """Record that provisioning finished, extension included (status shows it)."""
    if not (root / MARKER).exists():
        info = {"provisioned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "package": PACKAGE}
        (root / MARKER).write_text(json.dumps(info) + "\n")
