"""The clock shift of the skew tests, checked from inside the shifted process.

A Python process started with ``ClockShift.env(seconds)`` reports its wall clock,
its monotonic clock and how long each kind of wait took, measured on its own
monotonic clock. This test, outside it, checks that only the wall clock
moved: ``time.time()`` and ``datetime.now()`` are ``seconds`` off ours,
``time.monotonic()`` reads between our readings before and after the process
ran (the kernel's monotonic clock is one for all processes, so this also
proves the waits below were timed on a true clock), and ``time.sleep``,
``threading`` waits, ``queue``, ``select`` and socket timeouts keep their
length. Without the monosleep shim, ``time.sleep`` raises EINVAL; with the
monotonic clock faked too, threading waits hang (infra/faketime).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.e2e.harness import ClockShift

WAIT = 0.2
# A wait may overrun on a loaded machine (xdist workers share two cores); never
# by a broken shift's amount, which is an error, a hang or the whole offset.
OVERRUN = 0.8
# time.time() is a float of about 1.8e9 s: its rounding is far below this.
ROUNDING = 0.001

PROBE = r"""
import datetime, json, queue, select, socket, sys, threading, time

def timed(wait):
    start = time.monotonic()
    try:
        wait()
    except Exception as exc:  # reported, so the test says which wait broke and how
        return f"{type(exc).__name__}: {exc}"
    return time.monotonic() - start

def lock_wait():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=WAIT)

def condition_wait():
    condition = threading.Condition()
    with condition:
        condition.wait(WAIT)

def queue_wait():
    try:
        queue.Queue().get(timeout=WAIT)
    except queue.Empty:
        pass

def socket_wait():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(WAIT)
        try:
            server.accept()
        except TimeoutError:
            pass

def thread_sleep():
    thread = threading.Thread(target=time.sleep, args=(WAIT,))
    thread.start()
    thread.join()

WAIT = float(sys.argv[1])
report = {
    "time": time.time(),
    "now_utc": datetime.datetime.now(datetime.timezone.utc).timestamp(),
    "now_local": datetime.datetime.now().astimezone().timestamp(),
    "monotonic": time.monotonic(),
    "waits": {
        "time.sleep": timed(lambda: time.sleep(WAIT)),
        "time.sleep in a thread": timed(thread_sleep),
        "threading.Event.wait": timed(lambda: threading.Event().wait(WAIT)),
        "threading.Lock.acquire": timed(lock_wait),
        "threading.Condition.wait": timed(condition_wait),
        "queue.Queue.get": timed(queue_wait),
        "select.select": timed(lambda: select.select([], [], [], WAIT)),
        "socket accept timeout": timed(socket_wait),
    },
}
print(json.dumps(report))
"""


@pytest.mark.parametrize("seconds", [600, -600], ids=["ahead-10min", "behind-10min"])
def test_only_the_wall_clock_moves(clock_shift: ClockShift, seconds: int) -> None:
    wall_before, mono_before = time.time(), time.monotonic()
    result = subprocess.run([sys.executable, "-c", PROBE, str(WAIT)],
                            env={**os.environ, **clock_shift.env(seconds)},
                            capture_output=True, text=True, timeout=30, check=False)
    wall_after, mono_after = time.time(), time.monotonic()
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)

    # Each wall reading was taken while the process ran, so it lies between our
    # readings before and after, moved by the shift.
    low, high = wall_before + seconds - ROUNDING, wall_after + seconds + ROUNDING
    for name in ("time", "now_utc", "now_local"):
        assert low <= seen[name] <= high, (
            f"{name}: {seen[name] - wall_before:+.3f} s from ours at the start; "
            f"expected {seconds:+d} s (within the {wall_after - wall_before:.3f} s it ran)")
    assert mono_before <= seen["monotonic"] <= mono_after, (
        f"monotonic moved: {seen['monotonic'] - mono_before:+.3f} s from ours at the start")
    wrong = {name: took for name, took in seen["waits"].items()
             if isinstance(took, str) or not WAIT - ROUNDING <= took <= WAIT + OVERRUN}
    assert not wrong, f"waits of {WAIT} s that took another time (or failed): {wrong}"
