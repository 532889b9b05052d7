"""The gateway as a process: startup, signals, bad arguments, a missing PostgreSQL."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pymongo.errors import OperationFailure

from localdb_support import TOOL_ROOT, GatewayProcess, start_gateway, subprocess_env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_with_clients_connected(pg_dsn: str, tmp_path: Path,
                                                      sig: signal.Signals) -> None:
    process = start_gateway(pg_dsn, tmp_path / "gw.log")
    client = process.client()
    with client.start_session() as session:
        session.start_transaction()
        client.db.t.insert_one({"x": 1}, session=session)  # left open on purpose
        assert process.stop(sig) == 0, process.log()
    client.close()
    assert "stopped" in process.log()


def test_port_in_use_exits_with_error(pg_dsn: str, gateway: GatewayProcess) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "localdb.gateway", "--listen",
         f"127.0.0.1:{gateway.port}", "--pg", pg_dsn],
        cwd=TOOL_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot listen" in result.stderr


def test_bad_listen_argument() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "localdb.gateway", "--listen", "nonsense"],
        cwd=TOOL_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "HOST:PORT" in result.stderr


def test_unreachable_postgres_is_an_error_reply_not_a_crash(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port with nothing behind it
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    process = start_gateway(f"host=127.0.0.1 port={dead_port} user=postgres "
                            "connect_timeout=1", tmp_path / "gw.log")
    client = process.client()
    try:
        assert client.admin.command("ping")["ok"] == 1.0
        with pytest.raises(OperationFailure) as caught:
            client.db.c.insert_one({"x": 1})
        assert caught.value.code == 6  # HostUnreachable
    finally:
        client.close()
        assert process.stop() == 0, process.log()


def test_sessions_killed_under_it_are_replaced(gw_client, gateway: GatewayProcess,
                                               pg_dsn: str) -> None:
    db = gw_client.gw_cli_restart
    db.c.insert_one({"x": 1})  # the gateway now holds idle PostgreSQL sessions
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE application_name = %s", (f"localdb-gateway-{gateway.proc.pid}",)).fetchone()
    assert killed[0] >= 1
    for _ in range(5):  # as after a PostgreSQL restart: no command fails
        db.c.insert_one({"x": 2})
    assert db.c.count_documents({}) == 6
    gw_client.drop_database("gw_cli_restart")
