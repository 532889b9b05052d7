"""Helpers shared by the localdb tests: the missing-server rule and gateway subprocesses.

The rule is the app's (tests/servers.py in the repository), copied here so the
tool's tests never import the application's test package: a missing server
skips a test on a laptop and fails it under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from pymongo import MongoClient

import localdb

TOOL_ROOT = Path(__file__).resolve().parents[1]  # infra/localdb
# Where the `localdb` under test was imported from (src/, or site-packages when installed).
PACKAGE_PARENT = Path(localdb.__file__).resolve().parents[1]
# The PostgreSQL that `python -m localdb start` runs: LOCALDB_PG_PORT, as the manager reads it.
DEFAULT_DSN = (f"host=127.0.0.1 port={os.environ.get('LOCALDB_PG_PORT') or 5433} "
               "user=postgres dbname=postgres")
START_TIMEOUT_S = 20.0
_LISTENING = re.compile(r"listening on (\S+):(\d+),")


def in_ci() -> bool:
    """True under ``CI=true``, where a missing server fails a test instead of skipping it."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the test because a prerequisite is missing; fail instead under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


def require(what: str, error: BaseException | str) -> NoReturn:
    """Fail under CI, skip elsewhere, when something a test needs is missing."""
    unavailable(f"{what} is not available: {error}")


def subprocess_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with PYTHONPATH set so children import the same `localdb`."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH", "")]))
    return env


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
    """Start `python -m localdb.gateway` on a free port; wait until it listens."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localdb.gateway", "--listen", "127.0.0.1:0",
             "--pg", dsn, "--log-level", "INFO", *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=TOOL_ROOT,
            env=subprocess_env())
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
