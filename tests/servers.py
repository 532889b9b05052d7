"""The one rule for a missing server: skip on a laptop, fail under ``CI=true``."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True under ``CI=true``, where a missing server fails a test instead of skipping it."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the test because a prerequisite is missing; fail instead under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


# The run's shared directory: made by the controlling pytest process (tests/conftest.py)
# and inherited by every pytest-xdist worker; servers started once for the whole run
# (the Pub/Sub emulator) leave their address there.
SHARED_DIR = "EVENTBUS_TEST_SHARED"
