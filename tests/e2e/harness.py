"""End-to-end harness: the Pub/Sub emulator, gunicorn services, push routes, waiting.

Plain classes and functions, no pytest fixtures (those are in
``tests/e2e/conftest.py``), so the same pieces work from a REPL or a bench.

- ``EmulatorScript``: ``pubsub-emulator.sh`` for one address and home dir.
- ``ServiceProcess``: ``gunicorn <app>`` on a free port, output in a log file.
- ``PushRoute``: a throwaway topic with a push subscription to an endpoint.
- ``Receiver``: a local HTTP endpoint that records pushes and answers scripted statuses.
- ``wait_until``: poll until something is true, or fail with what was last seen.
- ``pull_now``: what a pull subscription holds now (no long poll).
- ``SharedEmulator``: one emulator for the whole run, whichever xdist worker asks first.
- ``ClockShift``: the environment that starts a process with its wall clock shifted.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from infra import faketime
from infra.pubsub.config import PushPolicy
from infra.pubsub.resources import Admin
from tests.servers import in_ci as in_ci
from tests.servers import unavailable as unavailable

T = TypeVar("T")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
EMULATOR_SCRIPT = PROJECT_ROOT / "pubsub-emulator.sh"
# One emulator serves every pytest-xdist worker; each worker has its own project on it,
# so a topic every service shares (the public ``order-status``) is never another
# worker's. Without xdist the project is the local default, ``local-project``.
E2E_PROJECT = (f"local-project-{os.environ['PYTEST_XDIST_WORKER']}"
               if os.environ.get("PYTEST_XDIST_WORKER") else "local-project")

# Settings a developer's shell may carry that would change what the script
# creates; the harness decides them itself.
_SCRIPT_SETTINGS = re.compile(r"(PUBSUB_|PUSH_)\w+|GOOGLE_CLOUD_PROJECT|EVENTBUS_PULL_SUBSCRIPTION")


def free_port() -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.1,
    message: str = "",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that value.

    An exception from ``predicate`` counts as "not yet" (a server that is still
    starting refuses connections). On timeout, raise AssertionError naming
    ``message`` (or the predicate) and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    value: T | None = None
    error: Exception | None = None
    while True:
        try:
            value, error = predicate(), None
        except Exception as exc:  # "not yet"; reported on timeout
            error = exc
        if error is None and value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    what = message or getattr(predicate, "__name__", repr(predicate))
    seen = f"last error: {error!r}" if error is not None else f"last value: {value!r}"
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; {seen}") from error


def pull_now(admin: Admin, subscription: str, max_messages: int = 10) -> list[Any]:
    """Pull (and ack) what is waiting on ``subscription`` now, without a long poll.

    ``Admin.pull`` is a long poll: on an empty subscription the emulator holds
    it for about 14 s. Tests that poll (``wait_until``) or check that nothing
    is left use this instead; ``ReceivedMessage`` objects, like ``Admin.pull``.
    """
    path = admin.subscription_path(subscription)
    with warnings.catch_warnings():  # return_immediately is deprecated for production pulls
        warnings.simplefilter("ignore", DeprecationWarning)
        response = admin.subscriber.pull(subscription=path, max_messages=max_messages,
                                         return_immediately=True, timeout=15.0)
    received = list(response.received_messages)
    if received:
        admin.subscriber.acknowledge(subscription=path, ack_ids=[m.ack_id for m in received],
                                     timeout=15.0)
    return received


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


# An exception's own line in a traceback: "RuntimeError: broken on purpose".
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit): .+$")


def first_exception(path: Path) -> str:
    """The first exception line of a log, or "" when it has none.

    gunicorn's own halt traceback comes after the app's import error and
    fills the tail, so a failure message names the first cause on its own.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return next((line for line in text.splitlines() if _EXCEPTION_LINE.match(line)), "")


# --- the emulator -----------------------------------------------------------


class EmulatorError(RuntimeError):
    """pubsub-emulator.sh failed; the message holds its output."""


def emulator_prerequisites() -> str | None:
    """Why the emulator cannot run here (gcloud or java missing), or None.

    Honours ``GCLOUD`` like pubsub-emulator.sh does.
    """
    for tool in (os.environ.get("GCLOUD") or "gcloud", "java"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (the Pub/Sub emulator needs the Google Cloud CLI, Java)"
    return None


@dataclass(frozen=True)
class LiveProcess:
    """A running (not zombie) process as /proc shows it."""

    pid: int
    pgid: int
    command: str


def live_processes() -> list[LiveProcess]:
    """Every live process but this one; zombies (only waiting to be reaped) are left out."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            # Fields after the command name (which may hold spaces): state, ppid, pgrp, ...
            state, _, pgid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # exited while we looked
        if state != "Z":
            found.append(LiveProcess(int(proc.name), int(pgid), command.strip()))
    return found


def group_processes(pgid: int) -> list[LiveProcess]:
    """Live members of process group ``pgid``."""
    return [p for p in live_processes() if p.pgid == pgid]


def emulator_processes(port: int) -> list[str]:
    """Command lines of live emulator processes (gcloud wrapper, java) serving ``port``."""
    pattern = re.compile(rf"pubsub.*[=:]{port}(\s|$)")
    return [f"{p.pid}: {p.command}" for p in live_processes() if pattern.search(p.command)]


@dataclass
class EmulatorScript:
    """``pubsub-emulator.sh`` bound to one address and an isolated home directory."""

    host_port: str
    home: Path
    project: str = E2E_PROJECT

    @property
    def port(self) -> int:
        """The emulator's TCP port."""
        return int(self.host_port.rpartition(":")[2])

    @property
    def log_path(self) -> Path:
        """Where the script writes the emulator's output."""
        return self.home / str(self.port) / "emulator.log"

    def env(self, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """The script's environment: this address, home and interpreter, plus ``overrides``."""
        env = {k: v for k, v in os.environ.items() if not _SCRIPT_SETTINGS.fullmatch(k)}
        env.update(
            PUBSUB_EMULATOR_HOST=self.host_port,
            PUBSUB_EMULATOR_HOME=str(self.home),
            GOOGLE_CLOUD_PROJECT=self.project,
            PYTHON=sys.executable,
        )
        env.update(overrides or {})
        return env

    def run(
        self, command: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``pubsub-emulator.sh <command>`` and return its result, whatever the exit code."""
        return subprocess.run(
            ["bash", str(EMULATOR_SCRIPT), command],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Start the emulator and the resources ``env`` describes; EmulatorError if it fails."""
        result = self.run("start", env)
        if result.returncode != 0:
            raise EmulatorError(
                f"pubsub-emulator.sh start on {self.host_port} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}\n--- {self.log_path}:\n{log_tail(self.log_path)}"
            )
        return result

    def stop(self) -> subprocess.CompletedProcess[str]:
        """Stop the emulator; raise EmulatorError when the script fails or a process survives."""
        result = self.run("stop")
        left = emulator_processes(self.port)
        if result.returncode != 0 or left:
            raise EmulatorError(
                f"pubsub-emulator.sh stop exited {result.returncode}: "
                f"{result.stdout}{result.stderr}; still running: {left}"
            )
        return result


def start_emulator(home: Path, tries: int = 2) -> EmulatorScript:
    """Start a bare emulator (no resources) on a free port under ``home``.

    A second try on another port covers the race where something takes the
    free port between choosing it and the emulator binding it.
    """
    errors: list[str] = []
    for _ in range(tries):
        script = EmulatorScript(f"127.0.0.1:{free_port()}", home)
        try:
            script.start({"PUBSUB_CREATE_RESOURCES": "0"})
        except EmulatorError as exc:
            errors.append(str(exc))
            continue
        return script
    raise EmulatorError("\n\n".join(errors))


class SharedEmulator:
    """One emulator for a whole test run, whichever process (xdist worker) needs it first.

    ``directory`` is the run's shared directory (``EVENTBUS_TEST_SHARED``, made by
    the controlling pytest process in ``tests/conftest.py``). The first caller of
    ``address()`` starts the emulator under a file lock and writes its address
    there; later callers (other workers) read it. ``stop()`` is for the process
    that made the directory, once every worker is done.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.address_file = directory / "emulator-address"
        self.home = directory / "emulator-home"

    def script(self) -> EmulatorScript | None:
        """The emulator started for this run, if any."""
        try:
            host_port = self.address_file.read_text().strip()
        except FileNotFoundError:
            return None
        return EmulatorScript(host_port, self.home)

    def address(self) -> EmulatorScript:
        """The run's emulator, started now if no process has started it yet."""
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "emulator.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            script = self.script()
            if script is None:
                self.home.mkdir(exist_ok=True)
                script = start_emulator(self.home)
                self.address_file.write_text(script.host_port)
            return script

    def stop(self) -> None:
        """Stop the run's emulator if one was started; EmulatorError if it will not stop."""
        script = self.script()
        if script is not None:
            self.address_file.unlink()
            script.stop()


# --- a shifted wall clock ---------------------------------------------------


@dataclass(frozen=True)
class ClockShift:
    """libfaketime and the monosleep shim (``infra/faketime``), ready to preload.

    ``env(seconds)`` is what to add to a process's environment (a service's
    ``env``) to start it with its wall clock ``seconds`` ahead (negative:
    behind), while its monotonic clock, sleeps and timeouts stay the kernel's.
    """

    shim: Path
    library: Path

    @classmethod
    def build(cls, directory: Path = PROJECT_ROOT / "var" / "faketime") -> ClockShift:
        """Build the shim into ``directory``; ``faketime.FaketimeError`` when it cannot."""
        problem = faketime.missing()
        library = faketime.libfaketime()
        if problem or library is None:
            raise faketime.FaketimeError(problem or "libfaketime is not installed")
        return cls(faketime.build_shim(directory), library)

    def env(self, seconds: int) -> dict[str, str]:
        """The variables that shift a process's wall clock by ``seconds``."""
        return faketime.shifted_env(seconds, self.shim, self.library)


# --- push routes ------------------------------------------------------------


@dataclass
class PushRoute:
    """A uniquely named topic with one push subscription to ``endpoint``.

    With ``max_delivery_attempts`` set, a dead-letter topic and a pull
    subscription on it come along; ``dead_letters()`` reads them.
    """

    admin: Admin
    topic: str
    subscription: str
    endpoint: str
    dead_letter_topic: str | None = None
    dead_letter_subscription: str | None = None

    @classmethod
    def create(
        cls,
        admin: Admin,
        endpoint: str,
        *,
        prefix: str = "e2e",
        ack_deadline: int = 60,
        min_backoff: float = 1.0,
        max_backoff: float = 5.0,
        max_delivery_attempts: int = 0,
        no_wrapper: bool = False,
    ) -> PushRoute:
        """Create the topic and subscription (and dead-letter pair) on ``admin``'s emulator."""
        policy = PushPolicy(ack_deadline, min_backoff, max_backoff, max_delivery_attempts)
        topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
        route = cls(admin, topic, f"{topic}-push", endpoint)
        admin.ensure_topic(topic)
        if policy.dead_lettering:
            route.dead_letter_topic = f"{topic}-dlq"
            route.dead_letter_subscription = f"{topic}-dlq-pull"
            admin.ensure_topic(route.dead_letter_topic)
            admin.ensure_pull_subscription(route.dead_letter_subscription, route.dead_letter_topic)
        admin.ensure_push_subscription(
            route.subscription,
            topic,
            endpoint,
            policy,
            dead_letter_topic=route.dead_letter_topic,
            no_wrapper=no_wrapper,
        )
        return route

    @property
    def topic_path(self) -> str:
        """``projects/<project>/topics/<topic>``."""
        return self.admin.topic_path(self.topic)

    @property
    def subscription_path(self) -> str:
        """``projects/<project>/subscriptions/<subscription>``, as push bodies name it."""
        return self.admin.subscription_path(self.subscription)

    def service_env(self) -> dict[str, str]:
        """Settings that make a service publish to this route's topic on this emulator."""
        return {
            "PUBSUB_EMULATOR_HOST": self.admin.host,
            "GOOGLE_CLOUD_PROJECT": self.admin.project,
            "PUBSUB_TOPIC": self.topic,
        }

    def publish(self, data: bytes, **attributes: str) -> str:
        """Publish one message to the route's topic; return its message id."""
        return self.admin.publish(self.topic, data, attributes)

    def dead_letters(self, max_messages: int = 10) -> list[Any]:
        """Pull (and ack) what reached the dead-letter topic; ``ReceivedMessage`` objects."""
        if self.dead_letter_subscription is None:
            raise ValueError("this route has no dead-letter policy (max_delivery_attempts=0)")
        return pull_now(self.admin, self.dead_letter_subscription, max_messages)

    def delete(self) -> None:
        """Delete the subscriptions first (so pushes stop), then the topics."""
        self.admin.delete_subscription(self.subscription)
        if self.dead_letter_subscription:
            self.admin.delete_subscription(self.dead_letter_subscription)
        self.admin.delete_topic(self.topic)
        if self.dead_letter_topic:
            self.admin.delete_topic(self.dead_letter_topic)


# --- a recording push endpoint ----------------------------------------------


@dataclass(frozen=True)
class Push:
    """One request the Receiver got: when, path, headers, body and the status it answered."""

    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> Any:
        """The body parsed as JSON (the wrapped push body)."""
        return json.loads(self.body)

    def data(self) -> bytes:
        """``message.data`` of a wrapped push body, base64-decoded."""
        return base64.b64decode(self.json()["message"]["data"])


class Receiver:
    """A local HTTP endpoint that records every POST and answers scripted statuses.

    ``statuses`` are answered in order, one per request; after them, every
    request gets ``then``. Use as a context manager, or start()/stop().
    """

    def __init__(self, statuses: Iterable[int] = (), then: int = 204) -> None:
        self._script = iter(statuses)
        self._then = then
        self._pushes: list[Push] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint, with a trailing slash: ``http://127.0.0.1:<port>/``."""
        return f"http://127.0.0.1:{self._server.server_port}/"

    @property
    def pushes(self) -> list[Push]:
        """A snapshot of what was received so far, oldest first."""
        with self._lock:
            return list(self._pushes)

    def start(self) -> Receiver:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Push]:
        """Wait until at least ``count`` requests arrived; return them all."""
        try:
            return wait_until(
                lambda: self.pushes if len(self.pushes) >= count else None,
                timeout=timeout,
                message=f"{count} push(es) at {self.url}",
            )
        except AssertionError as exc:
            statuses = [push.status for push in self.pushes]
            raise AssertionError(f"{exc}; got {len(statuses)}, answered {statuses}") from None

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            status = next(self._script, self._then)
            self._pushes.append(Push(time.time(), path, headers, body, status))
        return status

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status = receiver._answer(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean; the pushes are recorded instead

        return Handler


# --- gunicorn ---------------------------------------------------------------


class ServiceError(RuntimeError):
    """The service did not come up; the message holds the log's tail."""


def gunicorn_command() -> list[str] | None:
    """How to run the project's gunicorn: the venv's script, else this interpreter's module."""
    script = PROJECT_ROOT / ".venv" / "bin" / "gunicorn"
    if script.exists():
        return [str(script)]
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)):
        return [str(Path(sys.executable).parent / "gunicorn")]
    return None


@dataclass
class ServiceProcess:
    """``gunicorn <app>`` on a free local port, in its own process group.

    The environment is this process's, plus ``PORT`` and ``env``. gunicorn
    runs in ``cwd``, so a ``gunicorn.conf.py`` there applies (``--bind`` and
    ``--workers`` on the command line win over it). stdout and stderr go to
    ``log_path``.
    """

    log_path: Path
    app: str = "main:app"
    cwd: Path = PROJECT_ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    workers: int = 2
    startup_timeout: float = 30.0
    extra_args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _terminated: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        """Base URL without a trailing slash: ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """True while the gunicorn master runs."""
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The gunicorn command line."""
        gunicorn = gunicorn_command()
        if gunicorn is None:
            raise ServiceError("gunicorn is not installed in .venv or next to this interpreter")
        return [
            *gunicorn,
            "--bind", f"127.0.0.1:{self.port}",
            "--workers", str(self.workers),
            *self.extra_args,
            self.app,
        ]  # fmt: skip

    def start(self) -> str:
        """Start gunicorn and wait for ``GET /health`` -> 200; return the base URL."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PORT": str(self.port), "PYTHONUNBUFFERED": "1", **self.env}
        self._terminated = False
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stop() reaches every worker
            )
        problem = self._wait_healthy()
        if problem:
            self.stop()
            cause = first_exception(self.log_path)
            raise ServiceError(
                f"gunicorn {self.app} did not answer GET {self.url}/health with 200: {problem}; "
                + (f"first exception: {cause}; " if cause else "")
                + f"last lines of {self.log_path}:\n{self.tail()}"
            )
        return self.url

    def terminate(self, quick: bool = False) -> None:
        """Signal the master once, without waiting (``stop`` waits for the end).

        SIGTERM, gunicorn's graceful shutdown, takes a second or more (a worker
        notices it only between its one-second polls); with ``quick``, SIGQUIT,
        gunicorn's quick shutdown, which ends the workers at once: for a test's
        clean-up, when nothing it checks runs any more. Several services told
        first and stopped afterwards end side by side.
        """
        if self.process is not None and self.process.poll() is None and not self._terminated:
            self.process.send_signal(signal.SIGQUIT if quick else signal.SIGTERM)
            self._terminated = True

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the master (gunicorn stops its workers), SIGKILL the group after ``grace`` s.

        Returns the master's exit code, or None if it was never started.
        """
        if self.process is None:
            return None
        pgid = self.process.pid  # start_new_session made the master the group leader
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        # Whatever is left in the group (a stuck worker, a killed master's orphans) goes now.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        code = self.process.wait(timeout=10)
        wait_until(
            lambda: not group_processes(pgid),
            timeout=10,
            message=f"process group {pgid} of {self.app} to end after SIGKILL",
        )
        return code

    def tail(self, lines: int = 40) -> str:
        """The last lines of the service's log."""
        return log_tail(self.log_path, lines)

    def _wait_healthy(self) -> str:
        """Poll /health until 200; return "" then, else why it gave up."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return f"gunicorn exited with code {self.process.returncode}"
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return ""
                    last = f"last answer {response.status}"
            except urllib.error.HTTPError as exc:
                last = f"last answer {exc.code}"
            except OSError as exc:  # refused while gunicorn is still binding
                last = f"last error: {exc}"
            time.sleep(0.1)
        return f"timed out after {self.startup_timeout:g}s, {last}"
