"""Run a coroutine to its end from a test, whatever loop the test's thread already has.

A session-scoped Playwright driver (``tests/browser``) keeps an event loop running in its
xdist worker's main thread, where ``asyncio.run`` refuses to start another; a thread of
its own has no loop, so the coroutine runs there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` with ``asyncio.run`` in a fresh thread; return or raise its outcome."""
    with ThreadPoolExecutor(1, thread_name_prefix="test-aio") as pool:
        return pool.submit(asyncio.run, coroutine).result()
