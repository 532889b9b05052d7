"""The console in headless Chromium: from the overview to a failed event, replay, success.

Screenshots go to the test's tmp dir; the overview is also copied to
``docs/console.png`` (the README's picture) when that file is missing or
``EVENTBUS_UPDATE_SCREENSHOT=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.browser.conftest import TOKEN, Console
from tests.ops.conftest import FIXED
from tests.run_stores import runs_of

DOCS = Path(__file__).resolve().parents[2] / "docs" / "console.png"


def seed(console: Console) -> str:
    bus = console.bus
    for n in range(6):
        bus.deliver(tag=f"ok-{n}")
        bus.clock.advance(900)
    bus.deliver("SUB_MGMT", partner="p-2")
    bus.deliver(mode="transient", orderId=31, tag="slow")
    bus.deliver(mode="permanent", orderId=12001, tag="other")
    key = bus.deliver(mode="permanent", orderId=12002, tag="browser-fix").key
    assert key is not None
    return key


def shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5000
    return path


def test_from_the_overview_to_a_failed_event_replayed_to_success(
        browser: Any, console: Console, tmp_path: Path) -> None:
    key = seed(console)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(console.signed_in("/"))
    assert page.url == f"{console.url}/"  # the token became a cookie and left the URL
    assert page.locator("#throughput rect.failed").count() == 24
    assert "FAILED(final)" in page.locator("table.counts").inner_text()
    overview = shot(page, tmp_path, "1-overview")
    if not DOCS.exists() or os.environ.get("EVENTBUS_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(overview, DOCS)

    page.get_by_text("Failed events by cause").click()
    assert page.locator("table.groups tbody tr").count() == 2
    row = page.locator("table.groups tbody tr", has_text="PermanentError")
    assert row.locator("td").nth(1).inner_text() == "2"
    row.locator("td a").first.click()
    shot(page, tmp_path, "2-failed-group")
    page.get_by_role("link", name=key).click()
    assert page.locator("#event-status").inner_text() == "FAILED(final)"
    assert page.locator("#timeline circle").count() == 1
    shot(page, tmp_path, "3-event-failed")

    FIXED.add("browser-fix")  # the handler is repaired
    page.locator("#replay-link").click()
    assert "Replay event" in page.locator("h1").inner_text()
    page.fill("input[name=why]", "handler repaired")
    page.locator("#confirm-replay").click()
    assert page.locator("td.outcome").inner_text() == "replayed"
    shot(page, tmp_path, "4-replayed")
    page.get_by_role("link", name=key).click()
    page.wait_for_selector('#event-status[data-status="SUCCESS"]', timeout=20_000)
    assert "handler repaired" in page.locator("body").inner_text()
    shot(page, tmp_path, "5-event-succeeded")
    record = console.bus.store.get(key)
    assert record["event_status"] == "SUCCESS" and record["replays"][0]["by"] == "local operator"
    assert console.bus.store.database["ops_effects"].find_one({"_id": "browser-fix"})["runs"] == 1
    page.close()


def test_a_payload_holding_a_script_is_shown_escaped(browser: Any, console: Console,
                                                     tmp_path: Path) -> None:
    script = "<script>alert('owned')</script><img src=x onerror=alert(2)>"
    key = console.bus.deliver(mode="permanent", orderId=script, tag="xss",
                              partner="<b>bold</b>").key
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(console.signed_in(f"/event?key={quote(key, safe='')}"))
    assert script in page.locator("#document").inner_text()
    assert script in page.locator("#event-error").inner_text()
    assert page.locator("script").count() == 1  # only the console's own console.js
    assert page.locator("img").count() == 0 and page.locator("b").count() == 0
    page.goto(f"{console.url}/failed")
    page.goto(f"{console.url}/partner?id=%3Cb%3Ebold%3C%2Fb%3E")
    assert "<b>bold</b>" in page.locator("h1").inner_text()
    shot(page, tmp_path, "escaped")
    assert dialogs == []
    page.close()


def test_replay_without_the_token_or_the_csrf_token_is_refused(
        browser: Any, console: Console) -> None:
    key = console.bus.deliver(mode="permanent", orderId=1, tag="refused").key
    stranger = browser.new_context()
    page = stranger.new_page()
    answer = page.goto(f"{console.url}/replay?key={quote(key, safe='')}")
    assert answer is not None and answer.status == 401
    posted = stranger.request.post(f"{console.url}/replay", form={"key": key})
    assert posted.status == 401
    wrong = page.goto(f"{console.url}/?token=not-{TOKEN}")
    assert wrong is not None and wrong.status == 401
    stranger.close()

    operator = browser.new_context()
    page = operator.new_page()
    page.goto(console.signed_in(f"/replay?key={quote(key, safe='')}"))
    assert page.locator("#confirm-replay").count() == 1
    no_csrf = operator.request.post(f"{console.url}/replay", form={"key": key})
    assert no_csrf.status == 403
    forged = operator.request.post(f"{console.url}/replay",
                                   form={"key": key, "csrf": "0" * 64})
    assert forged.status == 403
    page.evaluate("document.querySelector('input[name=csrf]').remove()")
    page.locator("#confirm-replay").click()
    assert "CSRF" in page.locator("body").inner_text()
    operator.close()
    record = console.bus.store.get(key)
    assert "replays" not in record and console.pusher.sent == 0


def test_the_partners_page_holds_a_breaker_open_and_closes_it(
        browser: Any, console: Console, tmp_path: Path) -> None:
    from tests.ops.test_partners_command import break_partner, park

    hostile = "<img src=x onerror=alert(3)>"
    break_partner(console.bus, "acme", hostile)
    park(console.bus, hostile)
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(console.signed_in("/partners"))
    rows = page.locator("#partners tbody tr")
    assert rows.count() == 2 and page.locator("img").count() == 0
    # By name: "<img ..." sorts before "acme" (whose last error holds the same text).
    other, acme = rows.nth(0), rows.nth(1)
    assert "open, until" in acme.inner_text() and hostile in acme.inner_text()
    assert other.locator("td a").inner_text() == hostile
    acme.locator("input[name=why]").fill("partner fixed")
    acme.get_by_role("button", name="Close").click()
    assert "closed" in rows.nth(1).inner_text()
    rows.nth(0).locator("input[name=why]").fill("maintenance")
    rows.nth(0).get_by_role("button", name="Hold open").click()
    assert "held open by" in rows.nth(0).inner_text()
    shot(page, tmp_path, "partners")
    assert dialogs == []
    page.close()


def test_the_rebuilds_page_is_reached_from_the_nav_and_shows_progress(
        browser: Any, console: Console, tmp_path: Path) -> None:
    hostile = "<img src=x onerror=alert(4)>"
    store = console.bus.store
    runs_of(store).rebuild_save({"rebuild_id": "rb-1", "by": "ops@example.com", "why": hostile,
                        "started": store.now(), "status": "running", "done": 30, "total": 120,
                        "counts": {"rebuilt": 29, "failed": 1}, "flags": {"emit_new": True}})
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(console.signed_in("/"))
    page.get_by_role("link", name="Rebuilds").click()
    rows = page.locator("#rebuilds tbody tr")
    assert rows.count() == 1 and page.locator("img").count() == 0
    text = rows.nth(0).inner_text()
    assert "rb-1" in text and "30/120" in text and hostile in text and "emit_new" in text
    assert page.locator("#rebuilds progress").get_attribute("value") == "30"
    shot(page, tmp_path, "rebuilds")
    assert dialogs == []
    page.close()
