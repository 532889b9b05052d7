"""The local tools on a shared machine: `make run`'s bind address, and `make stop` per checkout.

* The service `make run` starts listens on 127.0.0.1 unless ``HOST`` says otherwise, and
  the emulator's push endpoint reaches it either way (``infra/run-local.sh --dry-run``,
  and what gunicorn makes of that command line).
* The emulator is shared by every checkout (one per port under the user's cache):
  ``pubsub-emulator.sh stop`` from one checkout leaves it to another that uses it, and the
  last one stops it. A stand-in ``gcloud`` serves the emulator's ``GET /`` probe, so these
  tests need no Java and take a second or two.
* Two checkouts' ``make stop`` (``infra/stop-local.sh``, copied into two directories)
  against one local database home and one emulator: the second keeps working after the
  first stops, the last stop stops both. This one needs the local database (the machine's
  provisioned chroot); under ``CI=true`` it fails when that is missing, never skips.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.pubsub.probe import UP, ping
from tests.servers import unavailable

ROOT = Path(__file__).resolve().parents[1]
RUN_LOCAL = ROOT / "infra" / "run-local.sh"
STOP_LOCAL = ROOT / "infra" / "stop-local.sh"
EMULATOR_SCRIPT = ROOT / "pubsub-emulator.sh"
VENV = ROOT / ".venv"
# What a developer's shell may carry that would change the scripts' choices.
_LOCAL_SETTINGS = ("HOST", "PORT", "PUSH_ENDPOINT", "MONGODB_URI", "PUBSUB_EMULATOR_HOST",
                   "PUBSUB_EMULATOR_HOME", "PUBSUB_EMULATOR_OWNER", "LOCALDB_HOME",
                   "LOCALDB_PORT", "GCLOUD", "PYTHON")

FAKE_GCLOUD = """#!{python}
# `gcloud beta emulators pubsub start --host-port=H:P ...`: answers GET / with "Ok".
import http.server, sys
host, port = next(a for a in sys.argv if a.startswith("--host-port=")).split("=")[1].rsplit(":", 1)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"Ok\\n")
    def log_message(self, *args):
        pass
http.server.HTTPServer((host, int(port)), Ok).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LOCAL_SETTINGS}
    env.update(changes)
    return env


def run(cmd: list[str], env: Mapping[str, str], cwd: Path = ROOT,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=dict(env), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


# --- the service's address --------------------------------------------------------------


def dry_run(**env: str) -> dict[str, str]:
    """`infra/run-local.sh --dry-run`'s lines, as {"service": ..., "listen": ..., ...}."""
    result = run(["bash", str(RUN_LOCAL), "--dry-run"], clean_env(**env), timeout=30)
    assert result.returncode == 0, result.stderr
    pairs = (line.split(":", 1) for line in result.stdout.splitlines())
    return {key: value.strip() for key, value in pairs}


def test_make_run_serves_on_loopback_by_default() -> None:
    plan = dry_run()
    assert plan["listen"] == "127.0.0.1:8080"
    assert plan["push endpoint"] == "http://127.0.0.1:8080/"
    argv = shlex.split(plan["service"])
    assert argv[argv.index("--bind") + 1] == "127.0.0.1:8080"
    # What gunicorn itself makes of that command line (gunicorn.conf.py's own default,
    # 0.0.0.0 for Cloud Run's container, is overridden).
    printed = run([*argv[:-1], "--print-config", argv[-1]], clean_env(), timeout=60)
    assert printed.returncode == 0, printed.stderr
    (bind,) = [line for line in printed.stdout.splitlines() if line.startswith("bind ")]
    assert bind.split("=", 1)[1].strip() == "['127.0.0.1:8080']"


def test_host_opens_the_service_and_the_emulator_still_reaches_it() -> None:
    everywhere = dry_run(HOST="0.0.0.0", PORT="8099")
    assert everywhere["listen"] == "0.0.0.0:8099"
    assert "--bind 0.0.0.0:8099" in everywhere["service"]
    assert everywhere["push endpoint"] == everywhere["service url"] == "http://127.0.0.1:8099/"
    one = dry_run(HOST="127.0.0.2")
    assert one["push endpoint"] == "http://127.0.0.2:8080/"
    assert dry_run(PUSH_ENDPOINT="http://10.0.0.5:1/")["push endpoint"] == "http://10.0.0.5:1/"


def test_run_local_refuses_an_unknown_argument() -> None:
    result = run(["bash", str(RUN_LOCAL), "--bogus"], clean_env(), timeout=30)
    assert result.returncode == 2 and "usage: bash infra/run-local.sh [--dry-run]" in result.stderr


# --- the shared emulator ------------------------------------------------------------------


@dataclass
class Emulator:
    """pubsub-emulator.sh on a free port with a private home and a stand-in gcloud."""

    env: dict[str, str]
    host_port: str
    home: Path

    def run(self, *args: str, owner: Path | None = None,
            script: Path = EMULATOR_SCRIPT) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if owner is not None:
            env["PUBSUB_EMULATOR_OWNER"] = str(owner)
        return run(["bash", str(script), *args], env, timeout=60)

    def up(self) -> bool:
        return ping(self.host_port, timeout=1.0) == UP

    @property
    def state_dir(self) -> Path:
        return self.home / self.host_port.rpartition(":")[2]


@pytest.fixture
def fake_emulator(tmp_path: Path) -> Iterator[Emulator]:
    """The script with a stand-in gcloud: no server, so the quick tier runs these (the
    suite's ``emulator`` fixture, a real one, is a server fixture in tests/tiers.py)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    java = bin_dir / "java"  # the script checks that one is there; the stand-in needs none
    java.write_text("#!/bin/sh\nexit 0\n")
    for path in (gcloud, java):
        path.chmod(0o755)
    host_port = f"127.0.0.1:{free_port()}"
    env = clean_env(PUBSUB_EMULATOR_HOST=host_port, PUBSUB_EMULATOR_HOME=str(tmp_path / "pubsub"),
                    PUBSUB_CREATE_RESOURCES="0", GCLOUD=str(gcloud), PYTHON=sys.executable,
                    PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    found = Emulator(env, host_port, tmp_path / "pubsub")
    yield found
    found.run("stop", "--force")


def checkouts(tmp_path: Path, *names: str) -> list[Path]:
    made = [tmp_path / name for name in names]
    for path in made:
        path.mkdir()
    return made


def test_the_emulator_stays_up_for_another_checkout_and_the_last_stop_ends_it(
    fake_emulator: Emulator, tmp_path: Path
) -> None:
    first, second = checkouts(tmp_path, "checkout-a", "checkout-b")
    started = fake_emulator.run("start", owner=first)
    assert started.returncode == 0, started.stderr
    assert f"emulator started on {fake_emulator.host_port}" in started.stdout
    again = fake_emulator.run("start", owner=second)
    assert again.returncode == 0 and "already running" in again.stdout, again.stderr
    claims = sorted((fake_emulator.state_dir / "claims").glob("*.claim"))
    assert sorted(p.read_text().splitlines()[1] for p in claims) == [str(first), str(second)]

    stopped = fake_emulator.run("stop", owner=first)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines() == [
        f"released the claim of {first} on the emulator",
        f"emulator on {fake_emulator.host_port} left running: used by {second}",
    ]
    assert fake_emulator.up()  # the second checkout keeps its emulator
    again = fake_emulator.run("stop", owner=first)  # nothing of the first's left to release
    assert again.stdout == f"emulator on {fake_emulator.host_port} left running: used by {second}\n"
    assert fake_emulator.up()

    last = fake_emulator.run("stop", owner=second)
    assert last.returncode == 0 and "stopped (process group" in last.stdout, last.stdout
    assert not fake_emulator.up()
    assert "nothing to stop" in fake_emulator.run("stop", owner=second).stdout


def test_a_deleted_checkout_holds_no_claim(fake_emulator: Emulator, tmp_path: Path) -> None:
    first, second, third = checkouts(tmp_path, "checkout-a", "checkout-b", "checkout-c")
    assert fake_emulator.run("start", owner=first).returncode == 0
    assert fake_emulator.run("start", owner=second).returncode == 0
    second.rmdir()
    stranger = fake_emulator.run("stop", owner=third)  # it never started it
    assert stranger.stdout.endswith(f"left running: used by {first}\n") and fake_emulator.up()
    stopped = fake_emulator.run("stop", owner=first)
    assert "stopped (process group" in stopped.stdout, stopped.stdout
    assert not fake_emulator.up()


def test_a_checkout_without_a_claim_stops_nothing(fake_emulator: Emulator, tmp_path: Path) -> None:
    first, third = checkouts(tmp_path, "checkout-a", "checkout-c")
    assert fake_emulator.run("start", owner=first).returncode == 0
    first.rmdir()  # its only user is gone, but the third checkout never claimed it
    stranger = fake_emulator.run("stop", owner=third)
    assert f"left running: {third} holds no claim on it" in stranger.stdout
    assert "stop --force" in stranger.stdout and fake_emulator.up()
    forced = fake_emulator.run("stop", "--force", owner=third)
    assert "stopped (process group" in forced.stdout and not fake_emulator.up()


def test_an_emulator_an_older_script_started_is_left_running(
    fake_emulator: Emulator, tmp_path: Path
) -> None:
    (mine,) = checkouts(tmp_path, "checkout")
    assert fake_emulator.run("start", owner=mine).returncode == 0
    (fake_emulator.state_dir / "claims" / ".managed").unlink()  # as an older script leaves it
    kept = fake_emulator.run("stop", owner=mine)
    assert "records no claims (an older checkout?)" in kept.stdout and fake_emulator.up()
    forced = fake_emulator.run("stop", "--force", owner=mine)
    assert "stopped (process group" in forced.stdout and not fake_emulator.up()


def test_the_owner_must_be_a_directory(fake_emulator: Emulator, tmp_path: Path) -> None:
    result = fake_emulator.run("start", owner=tmp_path / "missing")
    assert result.returncode == 1 and "is not a directory" in result.stderr
    assert not fake_emulator.up()


# --- two checkouts' `make stop` against one database home -------------------------------


def fake_checkout(path: Path) -> Path:
    """A directory laid out like a checkout for infra/stop-local.sh: the two scripts, the
    venv and the emulator's Python half (links to this checkout's)."""
    (path / "infra").mkdir(parents=True)
    shutil.copy2(STOP_LOCAL, path / "infra" / "stop-local.sh")
    shutil.copy2(EMULATOR_SCRIPT, path / "pubsub-emulator.sh")
    shutil.copy2(ROOT / "infra" / "__init__.py", path / "infra" / "__init__.py")
    (path / "infra" / "pubsub").symlink_to(ROOT / "infra" / "pubsub")
    (path / ".venv").symlink_to(VENV)
    (path / "var").mkdir()
    return path


def start_like_make_run(checkout: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """What infra/run-local.sh does in `checkout` for the shared servers, plus a stand-in
    for its service (a process of that checkout with its pid file in var/)."""
    run_local = RUN_LOCAL.read_text()
    assert '$PY -m localdb start --dir "$ROOT"' in run_local  # the same commands as here
    assert "export PUBSUB_EMULATOR_OWNER=${PUBSUB_EMULATOR_OWNER:-$ROOT}" in run_local
    db = run([".venv/bin/python", "-m", "localdb", "start", "--dir", str(checkout)], env,
             cwd=checkout, timeout=300)
    if db.returncode != 0:
        unavailable(f"the local database did not start: {db.stderr.strip()}")
    emulator = run(["./pubsub-emulator.sh", "start"],
                   {**env, "PUBSUB_EMULATOR_OWNER": str(checkout)}, cwd=checkout)
    assert emulator.returncode == 0, emulator.stderr
    service = subprocess.Popen(["sleep", "300"], cwd=checkout, start_new_session=True)
    (checkout / "var" / "service.pid").write_text(f"{service.pid}\n")
    return service


def db_answers(uri: str) -> bool:
    from pymongo import MongoClient

    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=1500)
    try:
        client.admin.command("ping")
        return True
    except Exception:
        return False
    finally:
        client.close()


def gone(proc: subprocess.Popen[bytes], timeout: float = 10) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture
def database_home(mongo_uri: str, tmp_path: Path) -> Path:
    """A LOCALDB_HOME of the test's own that shares the machine's provisioned chroot."""
    from localdb import Config, provision

    chroot = Config.from_env().chroot
    if not provision.is_provisioned(chroot):
        unavailable(f"the local DocumentDB is not provisioned at {chroot} "
                    f"(the suite's MongoDB is {mongo_uri})")
    home = tmp_path / "localdb-home"
    home.mkdir()
    (home / "documentdb-sid").symlink_to(chroot)
    return home


def test_two_checkouts_make_stop_leaves_the_other_its_servers(
    database_home: Path, fake_emulator: Emulator, tmp_path: Path
) -> None:
    db_port = free_port()
    uri = f"mongodb://127.0.0.1:{db_port}/"
    env = {**fake_emulator.env, "LOCALDB_HOME": str(database_home), "LOCALDB_PORT": str(db_port)}
    env.pop("PYTHON")  # each checkout's own .venv/bin/python, as in make run
    first, second = (fake_checkout(tmp_path / name) for name in ("checkout-a", "checkout-b"))
    services = []
    try:
        services = [start_like_make_run(checkout, env) for checkout in (first, second)]
        assert db_answers(uri) and fake_emulator.up()

        stopped = run(["bash", "infra/stop-local.sh"], env, cwd=first)
        assert stopped.returncode == 0, stopped.stderr
        out = stopped.stdout + stopped.stderr
        assert f"service stopped (pid {services[0].pid})" in out
        assert f"emulator on {fake_emulator.host_port} left running: used by {second}" in out
        assert f"localdb: left running at {uri}: used by {second}" in out
        assert gone(services[0]) and services[1].poll() is None  # its own service only
        assert db_answers(uri) and fake_emulator.up()  # the second checkout keeps working

        last = run(["bash", "infra/stop-local.sh"], env, cwd=second)
        assert last.returncode == 0, last.stderr
        out = last.stdout + last.stderr
        assert f"service stopped (pid {services[1].pid})" in out
        assert "stopped (process group" in out and "localdb: stopped gateway" in out
        assert gone(services[1])
        assert not fake_emulator.up() and not db_answers(uri)
    finally:
        for service in services:
            if service.poll() is None:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait()
        run([".venv/bin/python", "-m", "localdb", "stop", "--force"], env, cwd=ROOT)


def test_stop_local_never_signals_a_pid_that_is_not_this_checkouts(tmp_path: Path) -> None:
    checkout = fake_checkout(tmp_path / "checkout")
    stranger = subprocess.Popen(["sleep", "60"], cwd=tmp_path, start_new_session=True)
    try:
        (checkout / "var" / "relay.pid").write_text(f"{stranger.pid}\n")
        # No emulator and no database of this checkout: both say there is nothing to stop.
        env = clean_env(PUBSUB_EMULATOR_HOME=str(tmp_path / "pubsub"),
                        PUBSUB_EMULATOR_HOST=f"127.0.0.1:{free_port()}",
                        LOCALDB_HOME=str(tmp_path / "localdb-home"),
                        LOCALDB_PORT=str(free_port()))
        result = run(["bash", "infra/stop-local.sh"], env, cwd=checkout)
        assert "relay was not running (removed the stale var/relay.pid)" in result.stdout
        time.sleep(0.2)
        assert stranger.poll() is None and not (checkout / "var" / "relay.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()
