"""Who uses the server (localdb.claims) and what `stop` does about it, without a server.

The server's processes are stand-ins here (`sleep`, recorded as an owned gateway), so
the decision "stop it, or leave it to its other users" runs in milliseconds; the real
DocumentDB shared by two checkouts is in test_manager.py
(test_two_checkouts_share_one_server_until_the_last_stops).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localdb import Config, LocalDBError, claims, ensure_started, manager, state
from localdb import __main__ as cli
from localdb.procs import Proc, is_running, spawn_detached, terminate, wait_for


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """A private home and a free port: never the session's server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return replace(Config.from_env({"LOCALDB_HOME": str(tmp_path / "home"), "PATH": ""}),
                   port=port)


@pytest.fixture
def checkouts(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "checkout-a", tmp_path / "checkout-b"
    first.mkdir()
    second.mkdir()
    return first, second


@pytest.fixture
def server(config: Config, tmp_path: Path) -> Iterator[Proc]:
    """A stand-in server process that the state file says localdb started."""
    proc = spawn_detached(["sleep", "60"], tmp_path / "sleep.log")
    comp = state.Component("gateway", proc.pid, proc.start_ticks, True, config.port, "")
    state.save(config.run_dir, state.State("documentdb", config.local_uri, [comp]))
    claims.mark_managed(config.run_dir)  # as ensure_started leaves it
    yield proc
    terminate(proc, signal.SIGTERM, 5.0, signal.SIGKILL)


def test_a_directory_claim_is_held_while_the_directory_exists(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    claim = claims.for_directory(checkout)
    assert claim.owner == str(checkout) and claim.live()
    assert claims.for_directory(checkout).key == claim.key  # one claim per checkout
    checkout.rmdir()
    assert not claim.live()
    with pytest.raises(LocalDBError, match="not a directory"):
        claims.for_directory(checkout)


def test_a_process_claim_is_held_while_the_process_runs(tmp_path: Path) -> None:
    proc = spawn_detached(["sleep", "30"], tmp_path / "sleep.log")
    claim = claims.for_process(proc.pid)
    assert claim.live() and claim.owner.startswith(f"pid {proc.pid} (")
    assert claim.owner.endswith(f") in {os.getcwd()}")
    assert wait_for(lambda: claims._command(proc.pid) == "sleep 30", 5.0)  # once exec'd
    assert claims.for_process(proc.pid).owner == f"pid {proc.pid} (sleep 30) in {os.getcwd()}"
    assert claims._command(proc.pid, limit=7) == "slee..."
    assert not replace(claim, start_ticks=proc.start_ticks + 1).live()  # a reused pid
    terminate(proc, signal.SIGTERM, 5.0, signal.SIGKILL)
    assert not claim.live()
    assert claims.for_process().pid == os.getpid()
    with pytest.raises(LocalDBError, match="no such process"):
        claims.for_process(proc.pid)


def test_a_claim_from_before_the_last_reboot_is_released(tmp_path: Path) -> None:
    claim = claims.for_directory(tmp_path)
    assert claim.live() and claim.boot == claims.boot_id()
    assert not replace(claim, boot="another-boot").live()


def test_prune_keeps_live_claims_and_drops_the_rest(tmp_path: Path, config: Config) -> None:
    run = config.run_dir
    alive = claims.for_directory(tmp_path)
    gone = replace(claims.for_directory(tmp_path), owner="/gone", directory="/gone/checkout")
    claims.add(run, alive)
    claims.add(run, gone)
    (run / claims.CLAIMS_DIR / "garbage.json").write_text("{not json")
    assert {c.owner for c in claims.recorded(run)} == {alive.owner, "/gone"}
    assert claims.live(run) == [alive]
    assert claims.prune(run) == [alive]
    assert sorted(p.name for p in (run / claims.CLAIMS_DIR).glob("*.json")) == [alive.key]
    assert claims.remove(run, alive) and not claims.remove(run, alive)


def test_managed_tells_a_state_written_by_an_older_localdb(config: Config) -> None:
    run = config.run_dir
    assert not claims.managed(run)
    state.save(run, state.State("documentdb", config.local_uri))
    claims.mark_managed(run)
    assert claims.managed(run)
    # An older localdb (no claims) starts the server again: same format, new content.
    raw = json.loads((run / state.STATE_FILE).read_text())
    raw["components"] = [{"name": "gateway", "pid": 1, "start_ticks": 1, "owned": True,
                          "port": 1, "log": ""}]
    (run / state.STATE_FILE).write_text(json.dumps(raw))
    assert state.load(run) is not None and not claims.managed(run)


def test_stop_leaves_the_server_to_its_other_user_and_the_last_stop_stops_it(
    config: Config, server: Proc, checkouts: tuple[Path, Path]
) -> None:
    first, second = (claims.for_directory(c) for c in checkouts)
    claims.add(config.run_dir, first)
    claims.add(config.run_dir, second)
    messages = manager.stop(config, claim=first)
    assert messages == [f"released the claim of {first.owner}",
                        f"left running at {config.local_uri}: used by {second.owner}"]
    assert is_running(server) and state.load(config.run_dir) is not None
    assert [c.owner for c in claims.live(config.run_dir)] == [second.owner]
    # The first checkout is gone: a later stop of the second is the last one.
    messages = manager.stop(config, claim=second)
    assert messages == [f"stopped gateway (pid {server.pid})"]
    assert not is_running(server) and state.load(config.run_dir) is None
    assert claims.recorded(config.run_dir) == []


def test_a_released_claim_counts_for_nothing(
    config: Config, server: Proc, checkouts: tuple[Path, Path], tmp_path: Path
) -> None:
    user = spawn_detached(["sleep", "30"], tmp_path / "user.log")
    test_run = claims.for_process(user.pid)
    gone_checkout = tmp_path / "deleted-checkout"
    gone_checkout.mkdir()
    deleted = claims.for_directory(gone_checkout)
    mine = claims.for_directory(checkouts[0])
    for claim in (test_run, deleted, mine):
        claims.add(config.run_dir, claim)
    gone_checkout.rmdir()
    assert manager.stop(config, claim=mine)[-1].endswith(f"used by {test_run.owner}")
    assert is_running(server)
    terminate(user, signal.SIGTERM, 5.0, signal.SIGKILL)  # the test run ends
    claims.add(config.run_dir, mine)
    assert manager.stop(config, claim=mine) == [f"stopped gateway (pid {server.pid})"]


def test_stop_without_a_claim_of_its_own_leaves_the_server_running(
    config: Config, server: Proc, checkouts: tuple[Path, Path]
) -> None:
    # Started by a test run that has ended (its claim is released); this checkout never
    # claimed it.
    stranger = claims.for_directory(checkouts[1])
    (message,) = manager.stop(config, claim=stranger)
    assert f"{stranger.owner} holds no claim on it" in message and "--force" in message
    assert is_running(server)
    assert manager.stop(config, claim=stranger, force=True) == [
        f"stopped gateway (pid {server.pid})"]
    assert not is_running(server)


def test_a_server_started_by_an_older_localdb_is_left_running(
    config: Config, server: Proc, checkouts: tuple[Path, Path]
) -> None:
    claims.clear(config.run_dir)  # no mark: state.json as a localdb without claims wrote it
    mine = claims.for_directory(checkouts[0])
    claims.add(config.run_dir, mine)  # `start` found it running and claimed it
    messages = manager.stop(config, claim=mine)
    assert messages[0] == f"released the claim of {mine.owner}"
    assert "records no claims (an older checkout?)" in messages[1]
    assert is_running(server)
    lines = manager.status(config).lines
    assert any("started by a localdb that records none" in line for line in lines)


def test_force_stops_whoever_uses_it(
    config: Config, server: Proc, checkouts: tuple[Path, Path]
) -> None:
    mine, theirs = (claims.for_directory(c) for c in checkouts)
    claims.add(config.run_dir, mine)
    claims.add(config.run_dir, theirs)
    messages = manager.stop(config, claim=mine, force=True)
    assert messages == [f"stopped gateway (pid {server.pid})",
                        f"--force: stopped although used by {theirs.owner}"]
    assert claims.recorded(config.run_dir) == []


def test_a_failed_start_records_the_claim_and_the_mark(
    config: Config, checkouts: tuple[Path, Path], tmp_path: Path
) -> None:
    fake = tmp_path / "bin" / "mongod"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    config = replace(config, mongod=str(fake))
    mine = claims.for_directory(checkouts[0])
    with pytest.raises(LocalDBError, match="exited at startup"):
        ensure_started(config, note=lambda _: None, claim=mine)
    assert claims.live(config.run_dir) == [mine] and claims.managed(config.run_dir)
    assert any("had already exited" in m for m in manager.stop(config, claim=mine))
    assert state.load(config.run_dir) is None


def test_status_names_the_users(config: Config, server: Proc, tmp_path: Path) -> None:
    claim = claims.for_directory(tmp_path)
    claims.add(config.run_dir, claim)
    assert f"used by: {claim.owner} (since {claim.since})" in manager.status(config).lines


def test_the_cli_claims_the_current_directory_or_the_named_one(
    config: Config, server: Proc, checkouts: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    monkeypatch.setenv("LOCALDB_HOME", str(config.home))
    monkeypatch.setenv("LOCALDB_PORT", str(config.port))
    monkeypatch.setenv("PATH", "")
    first, second = checkouts
    claims.add(config.run_dir, claims.for_directory(second))
    monkeypatch.chdir(first)
    claims.add(config.run_dir, claims.for_directory(first))  # what `start` here records
    assert cli.main(["stop"]) == 0
    err = capsys.readouterr().err
    assert f"localdb: released the claim of {first}\n" in err
    assert f"used by {second}" in err and is_running(server)
    assert cli.main(["stop", "--dir", str(second)]) == 0
    assert f"localdb: stopped gateway (pid {server.pid})" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["start", "--force"])


def test_a_pid_claim_from_the_shell(config: Config, server: Proc) -> None:
    """What infra/test.sh does: `start --pid $$`, then `stop --pid $$` from the same shell."""
    shell = subprocess.Popen(["sleep", "30"])
    try:
        claims.add(config.run_dir, claims.for_process(shell.pid))
        assert manager.stop(config, claim=claims.for_process(shell.pid)) == [
            f"stopped gateway (pid {server.pid})"]
    finally:
        shell.terminate()
        shell.wait()
