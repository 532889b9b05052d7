"""Tests of the localdb manager: decision logic as pure unit tests, then the real DocumentDB.

The real tests share the one provisioned chroot (and its PostgreSQL) but use a
private run/log directory and gateway port, so they never stop a server that
the test session or a developer started. They skip when the server cannot
start, except under CI=true where they fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localdb import (
    Backend,
    Config,
    LocalDBError,
    choose_backend,
    chroot,
    documentdb,
    ensure_started,
    manager,
    mongod,
    postgres,
    provision,
    servers,
    state,
    status,
)
from localdb import __main__ as cli
from localdb import stop as stop_localdb
from localdb.probes import mongo_ping
from localdb.procs import Proc, identify, is_running, last_line, spawn_detached, terminate
from localdb_support import TOOL_ROOT, subprocess_env, unavailable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_config(tmp_path: Path, **changes: object) -> Config:
    base = Config.from_env({"LOCALDB_HOME": str(tmp_path / "home"), "PATH": ""})
    return replace(base, **{"port": free_port(), **changes})  # type: ignore[arg-type]


def fake_mongod(bin_dir: Path) -> Path:
    """A `mongod` that records its argv in $FAKE_MONGOD_ARGS, complains, and exits 3."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "mongod"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$FAKE_MONGOD_ARGS"\n'
                      'echo "fake mongod: no real server here" >&2\nexit 3\n')
    script.chmod(0o755)
    return script


# --- configuration and backend choice ------------------------------------------------


def test_home_prefers_localdb_home_then_xdg_then_home() -> None:
    assert Config.from_env({"LOCALDB_HOME": "/x/ldb", "HOME": "/h"}).home == Path("/x/ldb")
    xdg = Config.from_env({"XDG_CACHE_HOME": "/c", "HOME": "/h"})
    assert xdg.home == Path("/c/partner-eventbus")
    plain = Config.from_env({"HOME": "/h"})
    assert plain.home == Path("/h/.cache/partner-eventbus")
    assert plain.chroot == Path("/h/.cache/partner-eventbus/documentdb-sid")
    assert plain.logs_dir == plain.home / "logs" and plain.run_dir == plain.home / "run"


def test_ports_default_and_override() -> None:
    default = Config.from_env({"HOME": "/h"})
    assert (default.port, default.pg_port) == (27018, 5433)
    assert default.local_uri == "mongodb://127.0.0.1:27018/"
    moved = Config.from_env({"HOME": "/h", "LOCALDB_PORT": "27999", "LOCALDB_PG_PORT": "6543"})
    assert moved.local_uri == "mongodb://127.0.0.1:27999/"
    assert "port=6543" in moved.pg_dsn


@pytest.mark.parametrize("bad", ["abc", "0", "70000", "-1"])
def test_bad_port_is_a_clear_error(bad: str) -> None:
    with pytest.raises(LocalDBError, match="LOCALDB_PORT"):
        Config.from_env({"HOME": "/h", "LOCALDB_PORT": bad})


def test_mongodb_uri_wins_over_everything(tmp_path: Path) -> None:
    fake_mongod(tmp_path / "bin")
    env = {"HOME": "/h", "MONGODB_URI": "mongodb://db.example:27017/",
           "PATH": str(tmp_path / "bin")}
    config = Config.from_env(env)
    assert choose_backend(config) is Backend.EXTERNAL
    assert manager.uri(config) == "mongodb://db.example:27017/"


def test_mongod_on_path_is_chosen_next(tmp_path: Path) -> None:
    script = fake_mongod(tmp_path / "bin")
    config = Config.from_env({"HOME": "/h", "PATH": f"/nonexistent:{tmp_path / 'bin'}"})
    assert config.mongod == str(script)
    assert choose_backend(config) is Backend.MONGOD


def test_documentdb_is_the_fallback() -> None:
    config = Config.from_env({"HOME": "/h", "PATH": "/nonexistent"})
    assert choose_backend(config) is Backend.DOCUMENTDB
    assert manager.uri(config) == "mongodb://127.0.0.1:27018/"


def test_redact_hides_only_the_password() -> None:
    assert manager.redact("mongodb://u:secret@h:1/db") == "mongodb://u:***@h:1/db"
    assert manager.redact("mongodb://h:1/") == "mongodb://h:1/"


# --- the mongod backend, with a fake mongod (proves the command line) ------------------


def test_mongod_backend_builds_the_command_and_reports_its_death(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args_file = tmp_path / "argv"
    monkeypatch.setenv("FAKE_MONGOD_ARGS", str(args_file))
    config = make_config(tmp_path, mongod=str(fake_mongod(tmp_path / "bin")))
    with pytest.raises(LocalDBError) as failure:
        ensure_started(config, note=lambda _: None)
    message = str(failure.value)
    assert "exited at startup (exit 3: fake mongod: no real server here)" in message
    assert str(config.log("mongod")) in message and "\n" not in message
    argv = args_file.read_text().splitlines()
    assert argv[0] == "--dbpath" and Path(argv[1]).name.startswith("localdb-mongod-")
    assert argv[2:] == ["--port", str(config.port), "--bind_ip", "127.0.0.1"]
    # The failed start is recorded, so stop cleans up the throwaway dbpath.
    assert Path(argv[1]).is_dir()
    assert any("had already exited" in m for m in stop_localdb(config))
    assert not Path(argv[1]).exists() and state.load(config.run_dir) is None


def test_mongod_command_line() -> None:
    cmd = mongod.command("/opt/m/mongod", Path("/tmp/d"), 27018)
    assert cmd == ["/opt/m/mongod", "--dbpath", "/tmp/d", "--port", "27018",
                   "--bind_ip", "127.0.0.1"]


def test_gateway_subprocess_imports_the_same_localdb(tmp_path: Path) -> None:
    parent = documentdb.PACKAGE_PARENT
    assert (parent / "localdb" / "gateway" / "__main__.py").is_file()
    assert documentdb.with_package(f"/a{os.pathsep}{parent}{os.pathsep}/b").split(os.pathsep) \
        == [str(parent), "/a", "/b"]
    assert documentdb.gateway_command(make_config(tmp_path))[1:3] == ["-m", "localdb.gateway"]


# --- external URI --------------------------------------------------------------------


def test_unreachable_mongodb_uri_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(manager, "EXTERNAL_TIMEOUT", 0.3)
    monkeypatch.setenv("LOCALDB_HOME", str(tmp_path / "home"))  # never the session's state
    monkeypatch.setenv("MONGODB_URI", f"mongodb://app:pw@127.0.0.1:{free_port()}/")
    assert cli.main(["start"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("localdb: MONGODB_URI=")
    assert "pw" not in err and "unset MONGODB_URI" in err
    assert cli.main(["status"]) == cli.EXIT_DOWN
    assert cli.main(["stop"]) == 0  # nothing of ours to stop; just says so


def test_uri_command_prints_only_the_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    monkeypatch.setenv("LOCALDB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALDB_PORT", "27555")
    assert cli.main(["uri"]) == 0
    assert capsys.readouterr().out == "mongodb://127.0.0.1:27555/\n"


def test_status_is_down_with_exit_3_when_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("MONGODB_URI", "LOCALDB_PG_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCALDB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALDB_PORT", str(free_port()))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert cli.main(["status"]) == cli.EXIT_DOWN
    out = capsys.readouterr().out
    assert "state: down" in out and f"logs: {tmp_path / 'home' / 'logs'}" in out


# --- state, lock, processes ----------------------------------------------------------


def test_state_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    saved = state.State("documentdb", "mongodb://127.0.0.1:1/", mounts=["/m"], tmpdir=None)
    saved.components.append(state.Component("gateway", 42, 7, True, 1, "/l"))
    state.save(tmp_path, saved)
    assert state.load(tmp_path) == saved
    (tmp_path / state.STATE_FILE).write_text("{not json")
    assert state.load(tmp_path) is None


def test_lock_wait_has_a_timeout(tmp_path: Path) -> None:
    with state.locked(tmp_path, 1.0):
        holder = subprocess.run(
            [sys.executable, "-c", "from localdb import state; from pathlib import Path\n"
             f"with state.locked(Path({str(tmp_path)!r}), 0.3): pass"],
            capture_output=True, text=True, timeout=30, cwd=TOOL_ROOT, env=subprocess_env(),
            check=False,
        )
    assert holder.returncode != 0 and "held" in holder.stderr


def test_processes_are_recognised_by_pid_and_start_time(tmp_path: Path) -> None:
    proc = spawn_detached(["sleep", "30"], tmp_path / "sleep.log")
    try:
        assert is_running(proc) and identify(proc.pid) == proc
        assert not is_running(Proc(proc.pid, proc.start_ticks + 1))  # a reused pid
        assert os.getsid(proc.pid) == proc.pid  # detached in its own session
    finally:
        assert terminate(proc, signal.SIGTERM, 5.0, signal.SIGKILL)
    assert not is_running(proc)


def test_last_line_prefers_the_failure(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("first\nthe last\n\n")
    assert last_line(log) == "the last"
    log.write_text("FATAL:  data directory has invalid permissions\nDETAIL:  should be 0700\n")
    assert last_line(log) == "FATAL:  data directory has invalid permissions"
    assert last_line(tmp_path / "missing.log") == ""


def test_port_taken_by_a_non_mongodb_program_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        config = make_config(tmp_path, port=listener.getsockname()[1])
        assert servers.listener_pid(config.port) == os.getpid()
        with pytest.raises(LocalDBError, match="LOCALDB_PORT"):
            servers.reuse_or_adopt("gateway", config, None)


def test_free_port_means_start_a_new_server(tmp_path: Path) -> None:
    assert servers.reuse_or_adopt("gateway", make_config(tmp_path), None) is None


def test_mount_points_are_read_from_mountinfo() -> None:
    assert "/" in chroot.mount_points() and "/proc" in chroot.mount_points()
    assert chroot.mounts_under(Path("/nonexistent-dir")) == []


def test_chroot_command_runs_as_the_chroot_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n"
                                         "postgres:x:101:102::/var/lib/postgresql:/bin/bash\n")
    cmd = chroot.command(tmp_path, ["/bin/true"], user="postgres")
    assert cmd == ["chroot", "--userspec=101:102", "--groups=102", str(tmp_path), "/bin/true"]
    with pytest.raises(LocalDBError, match="nobody"):
        chroot.user_ids(tmp_path, "nobody")


# --- provisioning checks (no network, a fake tree) ---------------------------------


def test_provision_steps_recognise_finished_work(tmp_path: Path) -> None:
    root = tmp_path / "documentdb-sid"
    assert not provision.base_complete(root) and not provision.is_provisioned(root)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/apt-get").touch()
    (root / "debootstrap").mkdir()  # debootstrap still running or interrupted
    assert not provision.base_complete(root)
    (root / "debootstrap").rmdir()
    assert provision.base_complete(root)
    (root / provision.EXTENSION_LIB).parent.mkdir(parents=True)
    (root / provision.EXTENSION_LIB).touch()
    data = provision.pgdata(root)
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("18\n")
    (data / "postgresql.conf").write_text("# initdb defaults\n")
    assert not provision.cluster_ready(root)
    (data / "postgresql.conf").write_text(provision.CONF_BLOCK)
    assert provision.cluster_ready(root) and not provision.is_provisioned(root)
    provision.mark_provisioned(root)
    assert provision.is_provisioned(root)


def test_incomplete_chroot_is_not_deleted_but_explained(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config.chroot.mkdir(parents=True)
    (config.chroot / "debootstrap").mkdir()
    with pytest.raises(LocalDBError, match="incomplete chroot"):
        provision.ensure_base(config, note=lambda _: None)
    assert (config.chroot / "debootstrap").is_dir()


def test_stale_postmaster_pid_is_not_taken_for_a_server(tmp_path: Path) -> None:
    data = provision.pgdata(tmp_path)
    data.mkdir(parents=True)
    # Our own pid is alive, but it is not a postgres rooted in this chroot.
    (data / "postmaster.pid").write_text(f"{os.getpid()}\n/var/tmp/pgdata\n1\n5433\n")
    assert postgres.running_postmaster(tmp_path) is None


def test_postgres_port_taken_by_another_program_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        config = make_config(tmp_path, pg_port=listener.getsockname()[1])
        with pytest.raises(LocalDBError, match="LOCALDB_PG_PORT"):
            postgres.start(config, None)

def test_a_new_start_keeps_what_an_earlier_one_left_running(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    alive = spawn_detached(["sleep", "30"], tmp_path / "sleep.log")
    try:
        ours = state.Component("postgres", alive.pid, alive.start_ticks, True, 1, "")
        gone = state.Component("gateway", 999999, 1, True, 2, "")
        theirs = state.Component("mongod", alive.pid, alive.start_ticks, False, 3, "")
        earlier = state.State("documentdb", config.local_uri, [ours, gone, theirs],
                              mounts=["/proc", "/not-mounted"], tmpdir="/tmp/x")
        current = manager._carry_over(Backend.DOCUMENTDB, config, earlier)
        assert current.components == [ours] and current.mounts == ["/proc"]
        assert current.tmpdir == "/tmp/x"
    finally:
        terminate(alive, signal.SIGTERM, 5.0, signal.SIGKILL)

def test_leftover_state_of_another_port_is_cleaned_up(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    dead = state.Component("gateway", 999999, 1, True, 1, "")
    state.save(config.run_dir, state.State("documentdb", "mongodb://127.0.0.1:1/", [dead]))
    assert manager._usable_previous(config, Backend.DOCUMENTDB) is None
    assert state.load(config.run_dir) is None


# --- the real local DocumentDB -------------------------------------------------------


def real_config(tmp_path: Path) -> Config:
    """The machine's chroot and PostgreSQL, with a private run/log dir and gateway port."""
    shared = Config.from_env()
    return replace(shared, run_dir=tmp_path / "run", logs_dir=tmp_path / "logs",
                   port=free_port(), mongodb_uri=None, mongod=None)


def start_or_fail(config: Config) -> str:
    """Start the real server; under CI=true an unavailable server fails the test."""
    try:
        return ensure_started(config, note=lambda _: None)
    except LocalDBError as exc:
        unavailable(f"the local DocumentDB did not start: {exc}")


@pytest.fixture
def documentdb_config(tmp_path: Path) -> Iterator[Config]:
    config = real_config(tmp_path)
    yield config
    stop_localdb(config)  # even when the test failed half-way


def test_start_status_restart_and_stop(documentdb_config: Config) -> None:
    config = documentdb_config
    postgres_before = postgres.running_postmaster(config.chroot)
    uri = start_or_fail(config)
    assert uri == config.local_uri and mongo_ping(uri) is None
    report = status(config)
    assert report.up and report.backend == "documentdb"
    assert any(line.startswith("gateway: up") and "started by localdb" in line
               for line in report.lines)
    saved = state.load(config.run_dir)
    assert saved is not None
    pg = saved.component("postgres")
    assert pg is not None and pg.owned == (postgres_before is None)

    began = time.monotonic()
    assert ensure_started(config) == uri
    assert time.monotonic() - began < 10
    assert state.load(config.run_dir) == saved  # same processes: nothing restarted

    gateway = saved.component("gateway")
    assert gateway is not None and gateway.owned
    stop_localdb(config)
    assert not gateway.running() and mongo_ping(uri, timeout=0.5) is not None
    if postgres_before is not None:  # someone else's PostgreSQL: still there
        assert is_running(postgres_before[0])
    else:
        assert not pg.running()
    assert not status(config).up


def test_stop_leaves_servers_it_did_not_start(documentdb_config: Config, tmp_path: Path) -> None:
    start_or_fail(documentdb_config)  # provisioned, PostgreSQL up
    # A second manager (own state, own port) finds a gateway someone else started.
    config = replace(documentdb_config, run_dir=tmp_path / "run2", port=free_port())
    with foreign_gateway(config) as other:
        assert ensure_started(config) == config.local_uri
        saved = state.load(config.run_dir)
        assert saved is not None
        gateway, pg = saved.component("gateway"), saved.component("postgres")
        assert gateway is not None and not gateway.owned and gateway.pid == other.pid
        assert pg is not None and not pg.owned  # the first manager's (or someone's)
        messages = stop_localdb(config)
        assert any("left gateway running" in m for m in messages)
        assert any("left postgres running" in m for m in messages)
        assert other.poll() is None and mongo_ping(config.local_uri) is None
        assert pg.running()


@contextlib.contextmanager
def foreign_gateway(config: Config) -> Iterator[subprocess.Popen[bytes]]:
    """A gateway started by "someone else" (this test), outside localdb's state."""
    env = subprocess_env()
    config.logs_dir.mkdir(parents=True, exist_ok=True)
    with (config.logs_dir / "foreign-gateway.log").open("ab") as log:
        other = subprocess.Popen(documentdb.gateway_command(config), stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=TOOL_ROOT)
    try:
        deadline = time.monotonic() + 20
        while mongo_ping(config.local_uri, timeout=0.5) is not None:
            assert other.poll() is None and time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.2)
        yield other
    finally:
        other.terminate()
        other.wait(timeout=10)


def test_cli_start_twice_status_uri_stop(documentdb_config: Config, tmp_path: Path) -> None:
    start_or_fail(documentdb_config)  # provisions the shared chroot if needed
    home = tmp_path / "cli-home"
    home.mkdir()
    (home / "documentdb-sid").symlink_to(documentdb_config.chroot)  # share the chroot
    env = subprocess_env({**os.environ, "LOCALDB_HOME": str(home), "LOCALDB_PORT": str(free_port()),
                          "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    env.pop("MONGODB_URI", None)
    uri = f"mongodb://127.0.0.1:{env['LOCALDB_PORT']}/"
    try:
        first = run_cli(env, "start")
        assert (first.returncode, first.stdout) == (0, uri + "\n"), first.stderr
        began = time.monotonic()
        second = run_cli(env, "start")
        assert second.returncode == 0 and second.stdout == uri + "\n"
        assert time.monotonic() - began < 10
        assert run_cli(env, "uri").stdout == uri + "\n"
        up = run_cli(env, "status")
        assert up.returncode == 0 and "state: up" in up.stdout and str(home / "logs") in up.stdout
    finally:
        assert run_cli(env, "stop").returncode == 0
    down = run_cli(env, "status")
    assert down.returncode == cli.EXIT_DOWN and "state: down" in down.stdout


def test_two_checkouts_share_one_server_until_the_last_stops(
    documentdb_config: Config, tmp_path: Path
) -> None:
    """`make run` in two checkouts, then `make stop` in each: the CLI calls they make."""
    start_or_fail(documentdb_config)  # provisions the shared chroot if needed
    home = tmp_path / "shared-home"  # the one LOCALDB_HOME both checkouts use
    home.mkdir()
    (home / "documentdb-sid").symlink_to(documentdb_config.chroot)
    env = subprocess_env({**os.environ, "LOCALDB_HOME": str(home), "LOCALDB_PORT": str(free_port()),
                          "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    env.pop("MONGODB_URI", None)
    uri = f"mongodb://127.0.0.1:{env['LOCALDB_PORT']}/"
    first, second = tmp_path / "checkout-a", tmp_path / "checkout-b"
    first.mkdir()
    second.mkdir()
    try:
        for checkout in (first, second):
            started = run_cli(env, "start", cwd=checkout)
            assert (started.returncode, started.stdout) == (0, uri + "\n"), started.stderr
            assert f"in use by {checkout}" in started.stderr
        gateway = state.load(home / "run")
        assert gateway is not None and (comp := gateway.component("gateway")) is not None
        assert comp.owned

        stopped = run_cli(env, "stop", cwd=first)
        assert stopped.returncode == 0
        assert f"left running at {uri}: used by {second}" in stopped.stderr
        assert mongo_ping(uri) is None and comp.running()  # the second keeps working
        up = run_cli(env, "status", cwd=first)
        assert f"used by: {second} (since " in up.stdout and str(first) not in up.stdout

        last = run_cli(env, "stop", "--dir", str(second))  # from anywhere, naming it
        assert last.returncode == 0 and f"stopped gateway (pid {comp.pid})" in last.stderr
        assert not comp.running() and mongo_ping(uri, timeout=0.5) is not None
    finally:
        run_cli(env, "stop", "--force")
    assert run_cli(env, "status").returncode == cli.EXIT_DOWN


def run_cli(
    env: dict[str, str], *args: str, cwd: Path = TOOL_ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localdb", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False)

