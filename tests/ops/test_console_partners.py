"""The console's partners page: breakers, parked events, hold open and close, CSRF, escaping."""

from __future__ import annotations

from flask.testing import FlaskClient

from tests.ops.conftest import Bus
from tests.ops.test_console import HOST, get, signed_in
from tests.ops.test_partners_command import ESC, break_partner, park
from tests.partner_stores import beside

HOSTILE = '<script>alert(1)</script>"\''


def csrf_of(page: str) -> str:
    return page.split('name="csrf" value="')[1].split('"')[0]


def post(browser: FlaskClient, **form: str) -> int:
    return browser.post("/partners", data=form, base_url=f"http://{HOST}").status_code


def test_the_page_shows_each_breaker_escaped(bus: Bus) -> None:
    break_partner(bus, "acme", f"{HOSTILE}{ESC}")
    park(bus, "acme")
    park(bus, HOSTILE)
    page = get(signed_in(bus), "/partners").get_data(as_text=True)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'class="breaker-open"' in page and "open, until" in page
    assert ">1</td>" in page  # one parked event each


def test_hold_open_and_close_need_the_csrf_token_and_a_reason(bus: Bus) -> None:
    park(bus, "globex")
    browser = signed_in(bus)
    token = csrf_of(get(browser, "/partners").get_data(as_text=True))
    assert post(browser, name="globex", action="open", why="maintenance") == 403
    assert post(browser, name="globex", action="open", why=" ", csrf=token) == 400
    assert post(browser, name="globex", action="open", why="maintenance", csrf=token) == 303
    page = get(browser, "/partners").get_data(as_text=True)
    assert "held open by local operator: maintenance" in page
    assert post(browser, name="globex", action="close", why="back", csrf=token) == 303
    [audit_open, audit_close] = (beside(bus.store).breaker_get("globex") or {})["audit"]
    assert (audit_open["by"], audit_close["why"]) == ("local operator", "back")


def test_a_read_only_console_shows_no_form_and_refuses_the_post(bus: Bus) -> None:
    park(bus, "globex")
    browser = signed_in(bus, read_only=True)
    page = get(browser, "/partners").get_data(as_text=True)
    assert "globex" in page and "<form method=\"post\"" not in page
    assert post(browser, name="globex", action="open", why="x", csrf="0" * 64) == 403
