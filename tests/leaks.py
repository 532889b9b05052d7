"""Nothing outlives its test: a thread, an event loop, a child process or a listening socket.

After each test's teardown, what runs in this process that did not before
its setup is a leak, and the test errors at teardown naming each one (a
thread's name and where it was started, a process's command line, a socket's
address). What a fixture of a wider scope (class, module, package, session)
started belongs to that fixture, and may outlive the test. A thread that is
ending gets ``GRACE`` seconds to end.

A test closes what it starts: in a ``with`` block, at its fixture's teardown,
or, for what a helper builds for it, through ``tests.closing.closed_after_test``
(closed when the test ends; ``closed_here`` for one hypothesis example).

``EVENTBUS_LEAK_CHECK=off`` turns the check off (to see a test's own verdict
alone); ``warn`` reports leaks as warnings instead of errors.

Each check reads this process only (``threading.enumerate``, ``/proc/self``);
an event loop is known by the loops made since the run began (a weak set
filled by ``BaseEventLoop.__init__``). A few microseconds per test on a quiet
one; only a test that leaves something behind waits (up to ``GRACE``).
"""

from __future__ import annotations

import asyncio.base_events
import gc
import os
import threading
import time
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("EVENTBUS_LEAK_CHECK", "on").lower()
"""``on`` by default: every test closes what it starts, and a leak is an error at its
teardown (issue 40). ``warn`` lists the leaks in ``var/leaks/`` instead, ``off`` turns the
check off."""
GRACE = 1.0 if MODE == "on" else 0.2
"""How long a thread that is ending may take; a warning need not wait as long."""

# Threads a library starts once for the whole process, on first use, and never stops by
# design (not by a test's fault): name prefixes, each with the library that owns it.
PROCESS_WIDE = {
    "asyncio_": "the default executor of the main thread's event loop (asyncio.to_thread)",
}

# --- what runs now -----------------------------------------------------------------------

_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_original_init = asyncio.base_events.BaseEventLoop.__init__
_original_start = threading.Thread.start


def _tracking_init(self: asyncio.base_events.BaseEventLoop, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    _LOOPS.add(self)


_ROOT = str(Path(__file__).resolve().parent.parent)
_VENV = str(Path(_ROOT) / ".venv")


def _tracking_start(self: threading.Thread) -> None:
    # Where it was started, for the report: the innermost frames of the project's own code
    # (src/, tests/, ...), not of threading, concurrent.futures or asyncio.
    stack = traceback.StackSummary.extract(traceback.walk_stack(None), limit=40,
                                           lookup_lines=False)  # innermost first
    frames = [f for f in stack if f.filename.startswith(_ROOT)
              and not f.filename.startswith(_VENV) and not f.filename.endswith("leaks.py")][:3]
    self._eventbus_started_at = " <- ".join(  # type: ignore[attr-defined]
        f"{f.filename[len(_ROOT) + 1:]}:{f.lineno} {f.name}" for f in frames) or "?"
    _original_start(self)


@dataclass
class Snapshot:
    """What runs in this process at one moment."""

    threads: set[threading.Thread] = field(default_factory=set)
    loops: set[int] = field(default_factory=set)
    children: dict[int, str] = field(default_factory=dict)
    sockets: set[str] = field(default_factory=set)
    parents: dict[int, int] = field(default_factory=dict)
    """Each descendant's parent: a process that an older one started later (Chromium's
    utility processes, started as pages need them) belongs to the older one's owner."""

    @classmethod
    def now(cls) -> Snapshot:
        """Take one."""
        parents: dict[int, int] = {}
        return cls(set(threading.enumerate()), {id(loop) for loop in list(_LOOPS)},
                   _children(parents), _sockets(), parents)

    def absorb(self, other: Snapshot) -> None:
        """Count everything in ``other`` as belonging here too."""
        self.threads |= other.threads
        self.loops |= other.loops
        self.children.update(other.children)
        self.sockets |= other.sockets
        self.parents.update(other.parents)


def _children(parent_of: dict[int, int] | None = None) -> dict[int, str]:
    """This process's living descendants (pid -> command line), from ``/proc``; each one's
    parent goes into ``parent_of`` when given."""
    found: dict[int, str] = {}
    parents = [os.getpid()]
    while parents:
        parent = parents.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                pids = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for pid in map(int, pids):
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if state in ("Z", "X"):
                    continue  # exited, only not reaped yet: nothing runs
                if parent_of is not None:
                    parent_of[pid] = parent
                found[pid] = command.replace(b"\0", b" ").decode(errors="replace").strip()
                parents.append(pid)
    return found


def _sockets() -> set[str]:
    """The inodes of this process's open sockets (``socket:[N]``)."""
    found = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target[8:-1])
    return found


def _listening(inodes: set[str]) -> dict[str, str]:
    """Of ``inodes``, those that listen (TCP LISTEN, a listening unix socket): inode -> address."""
    found: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and parts[9] in inodes:
                port = int(parts[1].rsplit(":", 1)[1], 16)
                found[parts[9]] = f"{table} port {port}"
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) > 6 and parts[6] in inodes and int(parts[3], 16) & 0x10000:
            found[parts[6]] = f"unix socket {parts[7] if len(parts) > 7 else '(unnamed)'}"
    return found


# --- the check ---------------------------------------------------------------------------

_BEFORE = pytest.StashKey[Snapshot]()
_WIDER = Snapshot()  # what wider-scoped fixtures started: theirs for the rest of the run


def _descends(pid: int, older: set[int], parents: dict[int, int]) -> bool:
    """True when ``pid`` is one of ``older`` or a descendant of one (its owner's, not new)."""
    seen: set[int] = set()
    while pid not in seen:
        if pid in older:
            return True
        seen.add(pid)
        if pid not in parents:
            return False
        pid = parents[pid]
    return False


def _process_wide(thread: threading.Thread) -> bool:
    return thread.name.startswith(tuple(PROCESS_WIDE))


def _leaks(before: Snapshot) -> list[str]:
    now = Snapshot.now()
    leaks = []
    for thread in now.threads - before.threads - _WIDER.threads:
        if thread.is_alive() and not _process_wide(thread):
            kind = "daemon thread" if thread.daemon else "thread"
            where = getattr(thread, "_eventbus_started_at", "?")
            leaks.append(f"{kind} {thread.name!r} (started at {where})")
    new_loops = now.loops - before.loops - _WIDER.loops
    if new_loops:
        for loop in list(_LOOPS):
            if id(loop) in new_loops and loop.is_running():
                leaks.append(f"event loop {loop!r}, still running")
        if any(id(loop) in new_loops and not loop.is_closed() for loop in list(_LOOPS)):
            gc.collect()  # one nobody holds any more is gone, not left running
            leaks += [f"event loop {loop!r}, never closed" for loop in list(_LOOPS)
                      if id(loop) in new_loops and not loop.is_running() and not loop.is_closed()]
    older = before.children.keys() | _WIDER.children.keys()
    for pid, command in now.children.items():
        if not _descends(pid, older, now.parents):
            leaks.append(f"process {pid}: {command[:200]}")
    new_sockets = now.sockets - before.sockets - _WIDER.sockets
    if new_sockets:
        leaks += [f"listening {address} (inode {inode})"
                  for inode, address in _listening(new_sockets).items()]
    return leaks


if MODE != "off":
    asyncio.base_events.BaseEventLoop.__init__ = _tracking_init  # type: ignore[method-assign]
    threading.Thread.start = _tracking_start  # type: ignore[method-assign]

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                             request: pytest.FixtureRequest) -> Iterator[Any]:
        """What a fixture wider than a function starts is its own, not its first test's."""
        if fixturedef.scope == "function":
            return (yield)
        before = Snapshot.now()
        try:
            return (yield)
        finally:
            after = Snapshot.now()
            _WIDER.threads |= after.threads - before.threads
            _WIDER.loops |= after.loops - before.loops
            _WIDER.children.update({pid: command for pid, command in after.children.items()
                                    if pid not in before.children})
            _WIDER.sockets |= after.sockets - before.sockets

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
        """Note what runs before the test (and its function fixtures) start anything."""
        item.stash[_BEFORE] = Snapshot.now()
        return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        """After the teardown, fail the test if something it started still runs."""
        result = yield
        before = item.stash.get(_BEFORE, None)
        if before is None:
            return result
        leaks = _leaks(before)
        deadline = time.monotonic() + GRACE
        while leaks and time.monotonic() < deadline:
            time.sleep(0.05)
            leaks = _leaks(before)
        if leaks:
            # Each is reported once: the next test does not inherit the blame.
            _WIDER.absorb(Snapshot.now())
            message = "left running after the test:\n  " + "\n  ".join(sorted(leaks))
            if MODE == "warn":
                _note(item, leaks)
            else:
                raise Leaked(message)
        return result


    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(session: pytest.Session) -> None:
        """The run's notes start empty (the controller clears them before xdist's workers)."""
        if "PYTEST_XDIST_WORKER" not in os.environ:
            for path in _NOTES.glob("*.txt"):
                path.unlink()

    def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                                config: pytest.Config) -> None:
        """In ``warn`` mode, one line for the whole run (xdist's workers write, this reads)."""
        tests = sum(path.read_text().count("\n== ") for path in _NOTES.glob("*.txt"))
        if tests:
            terminalreporter.write_line(
                f"leak check (warn): {tests} tests left something running, listed in "
                f"{_NOTES.relative_to(_ROOT)}/; EVENTBUS_LEAK_CHECK=on makes each an error")


_NOTES = Path(_ROOT) / "var" / "leaks"


def _note(item: pytest.Item, leaks: list[str]) -> None:
    """Write a test's leaks to this worker's notes: one summary line, not a warning per test
    (a warning each made a green run's output 450 lines long)."""
    _NOTES.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with (_NOTES / f"{worker}.txt").open("a") as notes:
        notes.write(f"\n== {item.nodeid}\n  " + "\n  ".join(sorted(leaks)) + "\n")


class Leaked(AssertionError):
    """A test left something running after its teardown."""

