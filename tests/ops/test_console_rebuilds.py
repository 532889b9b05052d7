"""The console's rebuilds page: running and finished rebuilds, counts, progress, escaping."""

from __future__ import annotations

import datetime as dt
import json

from eventbus.rebuild.runner import QUIET, run_views
from eventbus.store.memory import MemoryEventStore
from tests.ops.conftest import Bus
from tests.ops.test_console import get, signed_in
from tests.run_stores import runs_of

HOSTILE = '<script>alert(1)</script>"\''


def test_the_page_lists_running_and_finished_rebuilds_with_their_counts(bus: Bus) -> None:
    for number in range(3):
        assert bus.deliver("SUB_MGMT", n=number).outcome.value == "processed"
    code, out, err = bus.run("rebuild", "--type", "SUB_MGMT", "--app",
                             "tests.ops.conftest:routes", "--why", "bug 7", "--json")
    assert code == 0, err
    finished = json.loads(out)["rebuild_id"]
    now = bus.store.now()
    runs_of(bus.store).rebuild_save({"rebuild_id": "rb-running", "by": "ops@example.com",
                            "why": HOSTILE, "started": now, "status": "running", "done": 40,
                            "total": 100, "counts": {"rebuilt": 38, "failed": 2},
                            "flags": {"emit_new": True, "new_calls": False},
                            "archive": "gs://bucket/partner-events/2024-03-0"})
    browser = signed_in(bus, read_only=True)
    overview = get(browser, "/").get_data(as_text=True)
    assert 'href="/rebuilds"' in overview  # the nav links it
    answer = get(browser, "/rebuilds")
    page = answer.get_data(as_text=True)
    assert answer.status_code == 200
    rows = page.split('<tbody>')[1].split("</tbody>")[0].split("<tr ")[1:]
    # Newest first: the running one was started after the finished one.
    assert [row.split("<td>")[1].split("</td>")[0] for row in rows] == ["rb-running", finished]
    running = next(row for row in rows if "rb-running" in row)
    assert 'class="rebuild-running"' in running and "40/100" in running
    assert "<td>38</td>" in running and "<td>2</td>" in running
    assert "gs://bucket/partner-events/2024-03-0" in running and "emit_new" in running
    assert "new_calls" not in running
    done = next(row for row in rows if finished in row)
    assert 'class="rebuild-finished"' in done and "3/3" in done and "<td>3</td>" in done
    assert "<td>store</td>" in done and "bug 7" in done
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<form method=\"post\"" not in page  # read-only: nothing to post


def test_a_running_rebuild_without_a_checkpoint_for_long_is_shown_quiet() -> None:
    store = MemoryEventStore()
    runs_of(store).rebuild_save({"rebuild_id": "rb-quiet", "by": "ops", "why": "x",
                        "started": store.now(), "status": "running", "done": 1, "total": 9})
    runs_of(store).rebuild_save({"rebuild_id": "rb-done", "by": "ops", "why": "x",
                        "started": store.now(), "status": "finished", "done": 9, "total": 9})
    soon = {view.rebuild_id: view for view in run_views(runs_of(store), store.now())}
    assert not soon["rb-quiet"].quiet and soon["rb-quiet"].percent == 11
    later = {view.rebuild_id: view
             for view in run_views(runs_of(store), store.now() + dt.timedelta(seconds=QUIET + 1))}
    assert later["rb-quiet"].quiet and not later["rb-done"].quiet


def test_no_rebuild_yet_says_so(bus: Bus) -> None:
    page = get(signed_in(bus), "/rebuilds").get_data(as_text=True)
    assert "No rebuild has run" in page and 'id="rebuilds"' not in page
