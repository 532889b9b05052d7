"""The two tiers: every test that needs a server is marked ``server``; ``make check`` runs the rest.

A test needs a server when it asks for one of ``SERVER_FIXTURES`` (directly or
through its fixtures), when it is the MongoDB half of a parametrized fixture
(a parameter ``mongo``: those ask for ``mongo_db`` only when they run), or when
it lives where every test does (``SERVER_PATHS``: the emulator, Chromium, PyPI).

``make check`` runs ``-m "not server"`` with ``EVENTBUS_TIER=check``; then a
server fixture that is set up anyway fails its test, saying that this list
missed it, rather than starting the local database in the quick tier.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

SERVER_FIXTURES = {"mongo_uri", "mongo_client", "mongo_db", "emulator", "browser"}
SERVER_PATHS = ("e2e", "browser", "packaging", "test_emulator_script.py")
"""Under ``tests/``: the emulator, Chromium and the network (PyPI) respectively."""
_TESTS = Path(__file__).parent


def needs_server(item: pytest.Item) -> bool:
    """Whether ``item`` needs MongoDB, the emulator, Chromium or the network."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "mongo" in callspec.params.values():
        return True
    try:
        first = item.path.relative_to(_TESTS).parts[0]
    except ValueError:
        return False
    return first in SERVER_PATHS


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers", "server: needs MongoDB, the emulator, Chromium or the network "
        "(set by tests/tiers.py; make check runs -m 'not server')")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that needs a server ``server``."""
    for item in items:
        if needs_server(item):
            item.add_marker(pytest.mark.server)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                         request: pytest.FixtureRequest) -> None:
    """In the quick tier, a server fixture fails the test that was not marked ``server``."""
    if os.environ.get("EVENTBUS_TIER") == "check" and fixturedef.argname in SERVER_FIXTURES:
        pytest.fail(f"this test sets up {fixturedef.argname!r} in make check (EVENTBUS_TIER="
                    "check): tests/tiers.py should have marked it server", pytrace=False)
