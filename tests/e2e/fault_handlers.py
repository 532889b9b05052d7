"""Test-only handlers, loaded into the real gunicorn service for the end-to-end tests.

Start the service with ``EVENTBUS_HANDLER_MODULES=tests.e2e.fault_handlers``: the app
includes the module's ``routes`` next to its own handlers.
Every handler's effect is ``count_run``: a non-idempotent ``$inc`` on
``e2e_effects.<tag>.runs``, so a second run of the same event shows up as 2.
``tag`` is a field of ``entity_data`` that the test chooses.

- ``TEST_EFFECT``: sleeps ``entity_data.sleep`` seconds (default 0), then counts.
- ``TEST_FLAKY``: raises a transient error on attempts up to ``fail_times``, then counts.
- ``TEST_PERMANENT``: counts, then raises ``PermanentError``.
- ``TEST_CRASH``: on its first attempt, SIGKILLs its own gunicorn worker; then counts.
- ``TEST_GATED``: while the file named by ``E2E_GATE_FILE`` exists, records that it
  waits (``e2e_gate_waits``) and waits; then counts.
- ``TEST_ASYNC``: an ``async def`` handler: awaits ``entity_data.sleep`` seconds (default
  0) on the processor's loop, then counts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from eventbus import Context, PermanentError, Router

EFFECTS = "e2e_effects"
GATE_WAITS = "e2e_gate_waits"
GATE_ENV = "E2E_GATE_FILE"
GATE_LIMIT_SECONDS = 30.0

routes = Router()


def count_run(context: Context) -> None:
    """The effect: add one to the runs of this event's tag (deliberately not idempotent)."""
    tag = context.event.entity_data["tag"]
    context.db[EFFECTS].update_one({"_id": tag}, {"$inc": {"runs": 1}}, upsert=True)


@routes.handler("TEST_EFFECT")
def effect(context: Context) -> None:
    """Sleep a little (``sleep`` seconds), then count one run."""
    time.sleep(float(context.event.entity_data.get("sleep", 0)))
    count_run(context)


@routes.handler("TEST_ASYNC")
async def effect_async(context: Context) -> None:
    """Await a little (``sleep`` seconds) without holding a thread, then count one run."""
    await asyncio.sleep(float(context.event.entity_data.get("sleep", 0)))
    count_run(context)


@routes.handler("TEST_FLAKY")
def flaky(context: Context) -> None:
    """Fail transiently on the first ``fail_times`` attempts, then count one run."""
    if context.attempt <= int(context.event.entity_data.get("fail_times", 1)):
        raise ConnectionError(f"flaky on attempt {context.attempt}")
    count_run(context)


@routes.handler("TEST_PERMANENT")
def permanent(context: Context) -> None:
    """Count one run, then fail for good."""
    count_run(context)
    raise PermanentError("this event can never succeed")


@routes.handler("TEST_CRASH")
def crash(context: Context) -> None:
    """Kill this gunicorn worker on the first attempt (mid-handler), then count one run."""
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    count_run(context)


@routes.handler("TEST_GATED")
def gated(context: Context) -> None:
    """Wait (bounded) while the gate file exists, then count one run."""
    gate = os.environ.get(GATE_ENV, "")
    if gate and os.path.exists(gate):
        context.db[GATE_WAITS].insert_one({"key": context.key, "attempt": context.attempt})
        deadline = time.monotonic() + GATE_LIMIT_SECONDS
        while os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
    count_run(context)
