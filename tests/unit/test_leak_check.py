"""The leak check itself (``tests/leaks.py``): what is new is a leak, what an older process
starts later is that process's."""

from __future__ import annotations

import subprocess
import time

from tests import leaks


def test_a_new_child_is_a_leak_and_what_an_older_one_starts_later_is_not() -> None:
    # An older process (a worker-wide browser, say) that starts a child of its own later.
    older = subprocess.Popen(["sh", "-c", "read line; sleep 30 & wait"], stdin=subprocess.PIPE)
    try:
        before = leaks.Snapshot.now()
        assert older.pid in before.children
        assert older.stdin is not None
        older.stdin.write(b"go\n")  # now it starts its child
        older.stdin.close()
        deadline = time.monotonic() + 5
        while "sleep 30" not in leaks.Snapshot.now().children.values():
            assert time.monotonic() < deadline, "the older process never started its child"
            time.sleep(0.05)
        assert not any(str(older.pid) in line for line in leaks._leaks(before))
        assert [line for line in leaks._leaks(before) if line.startswith("process")] == []
        new = subprocess.Popen(["sleep", "30"])
        try:
            found = leaks._leaks(before)
            assert any(line.startswith(f"process {new.pid}:") for line in found), found
        finally:
            new.kill()
            new.wait()
    finally:
        subprocess.run(["pkill", "-P", str(older.pid)], check=False)
        older.kill()
        older.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and leaks._leaks(before):
        time.sleep(0.05)
    assert [line for line in leaks._leaks(before) if line.startswith("process")] == []
