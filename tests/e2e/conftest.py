"""End-to-end fixtures: the Pub/Sub emulator, gunicorn services and push routes.

- ``emulator`` (session): ``host:port`` of a running emulator. Started through
  pubsub-emulator.sh on a free port with an isolated home by the first xdist
  worker that needs it, shared by all of them (each in its own project,
  ``E2E_PROJECT``), stopped at the end of the run.
  With ``E2E_REUSE_EMULATOR=1`` and ``PUBSUB_EMULATOR_HOST`` set, the emulator
  already at that address is used as is (and left running).
- ``service``: a factory, ``service(env=..., workers=2, app="main:app",
  cwd=PROJECT_ROOT) -> ServiceProcess``; gunicorn is up (``/health`` 200) when
  it returns; ``.url`` is the base URL. Stopped after the test.
- ``push_route``: a factory, ``push_route(emulator, endpoint, **policy) ->
  PushRoute`` (see harness.PushRoute.create for the policy keywords); the
  topic and subscriptions are deleted after the test.
- ``clock_shift`` (session): a ``ClockShift``; ``clock_shift.env(600)`` added to
  a service's ``env`` starts it with its wall clock 10 minutes ahead. Needs
  gcc and Debian's ``faketime`` (``infra/test.sh`` installs it).

When a test fails, the tail of each service's log (and of the emulator's) is
added to its report. Under ``CI=true`` a fixture that cannot start its server
fails the test; elsewhere a missing prerequisite (no gcloud, no gunicorn)
skips it. Every test in this directory gets the ``e2e`` marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from infra import faketime
from infra.pubsub.probe import UP, ping
from infra.pubsub.resources import Admin
from tests.e2e.harness import (
    E2E_PROJECT,
    PROJECT_ROOT,
    ClockShift,
    EmulatorError,
    EmulatorScript,
    PushRoute,
    ServiceError,
    ServiceProcess,
    SharedEmulator,
    emulator_prerequisites,
    gunicorn_command,
    log_tail,
    unavailable,
)
from tests.servers import SHARED_DIR

_HERE = Path(__file__).parent
# Services a test started, for its failure report.
_SERVICES = pytest.StashKey[list[ServiceProcess]]()
# The emulator this session started (absent when reused), for failure reports.
_EMULATOR = pytest.StashKey[EmulatorScript]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e as ``e2e`` so ``-m "not e2e"`` leaves them out."""
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On failure, add the service and emulator log tails to the test's report."""
    report = yield
    if report.failed:
        for service in item.stash.get(_SERVICES, []):
            report.sections.append((f"{service.app} log ({service.log_path})", service.tail()))
        emulator = item.session.stash.get(_EMULATOR, None)
        if emulator is not None:
            report.sections.append(
                (f"emulator log ({emulator.log_path})", log_tail(emulator.log_path, 20))
            )
    return report


@pytest.fixture(scope="session")
def emulator(request: pytest.FixtureRequest) -> Iterator[str]:
    """``host:port`` of the Pub/Sub emulator shared by the whole run (every xdist worker).

    Started once, by the first worker that needs it (``SharedEmulator``), and
    stopped by the controlling process when every worker is done
    (``tests/conftest.py``). Each worker works in its own project on it
    (``E2E_PROJECT``), with its own topic names.
    """
    reuse = os.environ.get("PUBSUB_EMULATOR_HOST")
    if os.environ.get("E2E_REUSE_EMULATOR") == "1" and reuse:
        if ping(reuse) != UP:
            pytest.fail(
                f"E2E_REUSE_EMULATOR=1 but no Pub/Sub emulator answers at {reuse}", pytrace=False
            )
        public_topics_exist(reuse)
        yield reuse
        return
    missing = emulator_prerequisites()
    if missing:
        unavailable(missing)
    try:
        script = SharedEmulator(Path(os.environ[SHARED_DIR])).address()
    except EmulatorError as exc:
        pytest.fail(f"the Pub/Sub emulator did not start:\n{exc}", pytrace=False)
    request.session.stash[_EMULATOR] = script
    public_topics_exist(script.host_port)
    yield script.host_port
    del request.session.stash[_EMULATOR]


def public_topics_exist(host: str) -> None:
    """Create the app's public topics, as ``pubsub-emulator.sh start`` does.

    Every order the app processes is forwarded to them; a test that reads
    one subscribes itself (a subscription holds what is published after it).
    """
    from infra.pubsub.__main__ import public_topics
    from infra.pubsub.resources import Admin

    with Admin(host, E2E_PROJECT) as admin:
        for topic in public_topics():
            admin.ensure_topic(topic)


@pytest.fixture
def service(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., ServiceProcess]]:
    """Factory: start gunicorn for a WSGI app and wait for /health; stopped after the test."""
    started: list[ServiceProcess] = []
    request.node.stash[_SERVICES] = started

    def start(
        env: Mapping[str, str] | None = None,
        workers: int = 2,
        app: str = "main:app",
        cwd: Path = PROJECT_ROOT,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> ServiceProcess:
        if gunicorn_command() is None:
            unavailable("gunicorn is not installed (.venv/bin/gunicorn)")
        process = ServiceProcess(
            log_path=tmp_path / f"service-{len(started) + 1}.log",
            app=app,
            cwd=cwd,
            env=dict(env or {}),
            workers=workers,
            startup_timeout=startup_timeout,
            extra_args=tuple(extra_args),
        )
        started.append(process)
        try:
            process.start()
        except ServiceError as exc:
            pytest.fail(str(exc), pytrace=False)
        return process

    yield start
    # The test is over: a quick shutdown (gunicorn's SIGQUIT), all told first, side by side.
    for process in started:
        process.terminate(quick=True)
    for process in reversed(started):
        process.stop()


@pytest.fixture
def push_route() -> Iterator[Callable[..., PushRoute]]:
    """Factory: ``push_route(emulator, endpoint, **policy)``; deleted after the test."""
    admins: dict[str, Admin] = {}
    routes: list[PushRoute] = []

    def create(emulator: str, endpoint: str, **policy: Any) -> PushRoute:
        admin = admins.get(emulator)
        if admin is None:
            admin = admins[emulator] = Admin(emulator, E2E_PROJECT)
        route = PushRoute.create(admin, endpoint, **policy)
        routes.append(route)
        return route

    yield create
    for route in routes:
        route.delete()
    for admin in admins.values():
        admin.close()


@pytest.fixture(scope="session")
def clock_shift() -> ClockShift:
    """libfaketime and the monosleep shim, built into ``var/faketime`` once per process."""
    missing = faketime.missing()
    if missing:
        unavailable(missing)
    try:
        return ClockShift.build()
    except faketime.FaketimeError as exc:
        pytest.fail(f"cannot shift a process's clock: {exc}", pytrace=False)
