"""Shared fixtures: a real MongoDB-compatible server for every storage test.

The server is ``MONGODB_URI`` when set; otherwise the local server that
``python -m localdb start`` provides (started here if needed, and claimed for this
process while it runs, so another checkout's ``make stop`` leaves it running). Under
``CI=true`` a missing server fails the tests that need it; it never skips them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.closing import close_all
from tests.servers import SHARED_DIR, unavailable

# The suite's own plugins: hypothesis's profiles and one-example reports, the leak check,
# and the ``server`` marker of the two tiers (``make check`` runs the tests without it).
pytest_plugins = ["tests.hypothesis_profiles", "tests.leaks", "tests.tiers"]

_SHARED = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """In the controlling process, make the run's shared directory for the servers.

    pytest-xdist workers inherit its path (``SHARED_DIR``) and leave it alone.
    """
    if hasattr(config, "workerinput"):
        return
    shared = Path(tempfile.mkdtemp(prefix="eventbus-tests-"))
    os.environ[SHARED_DIR] = str(shared)
    config.stash[_SHARED] = shared


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the tests for pytest-xdist.

    - The slow tests (``slow``, ``e2e``) come first, so the longest ones start
      while the many quick ones fill the other workers (``--dist loadgroup``
      hands the tests out in this order); the order within each kind is kept.
    - ``same_worker(reason=...)`` keeps a module's tests on one worker, in file
      order: for a module whose tests share something costly that the module
      makes once (its own emulator, a built wheel). The reason is required.
    - ``alone(reason=...)``: a test that cannot share the machine. ``infra/test.sh``
      runs the other tests on the workers first (``-m "not alone"``), then these
      in one process (``-m alone -n 0``). The reason is required.
    """
    for item in items:
        for name in ("same_worker", "alone"):
            marker = item.get_closest_marker(name)
            if marker is not None and not marker.kwargs.get("reason"):
                raise pytest.UsageError(f"{item.nodeid}: {name} needs reason=...")
        if item.get_closest_marker("same_worker"):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    e2e = Path(__file__).parent / "e2e"
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else
               1 if e2e in item.path.parents else 2)


@pytest.hookimpl(tryfirst=True)  # before xdist sends the report to the controller
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Escape lone surrogates in a report's captured output, as ``\\udXXX``.

    Tests feed hostile strings through logging (telemetry's hostile
    attributes); an xdist worker must send the captured text to the
    controller as UTF-8, which a lone surrogate is not.
    """
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop what the run started once (the emulator) when every worker is done."""
    shared = config.stash.get(_SHARED, None)
    if shared is None:
        return
    from tests.e2e.harness import SharedEmulator  # its imports cost; only now

    try:
        SharedEmulator(shared).stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(SHARED_DIR, None)


@pytest.fixture(autouse=True)
def _closes_what_helpers_built() -> Iterator[None]:
    """Close what the test's helpers built for it (``tests.closing.closed_after_test``)."""
    yield
    close_all()


def require_server(what: str, error: BaseException) -> None:
    """Fail under CI, skip elsewhere, when a server the test needs is missing."""
    unavailable(f"{what} is not available: {error}")


def _local_uri() -> str:
    if os.environ.get("MONGODB_URI"):
        return os.environ["MONGODB_URI"]
    from localdb import manager  # imported late: only storage tests need it

    return manager.ensure_started()


@pytest.fixture(scope="session")
def mongo_uri() -> str:
    """The URI of a running MongoDB-compatible server."""
    try:
        uri = _local_uri()
        MongoClient(uri, serverSelectionTimeoutMS=5000).admin.command("ping")
    except Exception as exc:  # any failure means "no server", reported once
        require_server("MongoDB", exc)
    return uri


@pytest.fixture(scope="session")
def mongo_client(mongo_uri: str) -> Iterator[MongoClient]:
    """A client shared by the session, tz-aware like the service's."""
    client: MongoClient = MongoClient(mongo_uri, tz_aware=True, serverSelectionTimeoutMS=5000)
    yield client
    client.close()


@pytest.fixture()
def mongo_db(mongo_client: MongoClient) -> Iterator[Database]:
    """A fresh database per test, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield mongo_client[name]
    mongo_client.drop_database(name)
