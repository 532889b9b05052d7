"""Fixtures for the gateway tests: a gateway subprocess on a free port, in front of
PostgreSQL + DocumentDB at LOCALDB_PG_DSN (default: the local server on 5433).

When that PostgreSQL does not answer, tests that need it are skipped, or fail
under CI=true (a missing server must never pass silently in CI).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.servers import unavailable

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DSN = "host=127.0.0.1 port=5433 user=postgres dbname=postgres"
START_TIMEOUT_S = 20.0
_LISTENING = re.compile(r"listening on (\S+):(\d+),")


def require(what: str, error: BaseException | str) -> None:
    """Fail under CI, skip elsewhere, when something a test needs is missing."""
    unavailable(f"{what} is not available: {error}")


@dataclass
class GatewayProcess:
    """A gateway started by the tests, with its log file."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path

    @property
    def uri(self) -> str:
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **options: object) -> MongoClient:
        opts: dict[str, object] = {"tz_aware": True, "serverSelectionTimeoutMS": 5000}
        opts.update(options)
        return MongoClient(self.uri, **opts)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_gateway(dsn: str, log_path: Path, *extra: str) -> GatewayProcess:
    """Start `python -m infra.localdb.gateway` on a free port; wait until it listens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.localdb.gateway", "--listen", "127.0.0.1:0",
             "--pg", dsn, "--log-level", "INFO", *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = _LISTENING.search(log_path.read_text(errors="replace"))
        if found:
            return GatewayProcess(proc, found.group(1), int(found.group(2)), log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"gateway did not start:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of a PostgreSQL with the DocumentDB extension, checked once."""
    dsn = os.environ.get("LOCALDB_PG_DSN", DEFAULT_DSN)
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_extension WHERE extname = 'documentdb'").fetchone()
    except psycopg.Error as exc:
        require(f"PostgreSQL at {dsn!r}", exc)
    if not found:
        require(f"PostgreSQL at {dsn!r}", "the documentdb extension is not installed")
    return dsn


@pytest.fixture(scope="session")
def gateway(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway subprocess shared by the session."""
    process = start_gateway(pg_dsn, tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield process
    status = process.stop()
    assert status == 0, f"gateway exited with {status}:\n{process.log()}"


@pytest.fixture(scope="session")
def gw_client(gateway: GatewayProcess) -> Iterator[MongoClient]:
    """A pymongo client of the shared gateway."""
    client = gateway.client()
    try:
        client.admin.command("ping")
    except Exception as exc:  # any failure here means the gateway is unusable
        require("the gateway", f"{exc}\n{gateway.log()}")
    yield client
    client.close()


@pytest.fixture()
def gw_db(gw_client: MongoClient) -> Iterator[Database]:
    """A fresh database per test, dropped afterwards."""
    name = f"gwtest_{uuid.uuid4().hex[:10]}"
    yield gw_client[name]
    gw_client.drop_database(name)
