"""The web console through Flask's test client: access, CSRF, read-only mode, escaping, IAP/OIDC."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import urllib.request
from typing import Any

import flask
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from flask.testing import FlaskClient
from google.auth import crypt, jwt

from eventbus.ops import cli
from eventbus.settings import SettingsError
from eventbus.web.console import ConsoleConfig, create_console_app, mount_console
from eventbus.web.console.access import COOKIE, IAP_HEADER, IAP_ISSUER
from tests.ops.conftest import FIXED, Bus

TOKEN = "local-token-123"
HOST = "127.0.0.1:8081"
OPERATOR = "ops@example.com"
AUDIENCE = "/projects/1/global/backendServices/2"


def client(bus: Bus, **config: Any) -> FlaskClient:
    settings = {"token": TOKEN, **config}
    app = create_console_app(bus.store, ConsoleConfig(**settings), settings=bus.settings,
                             publisher=lambda: bus.publisher, now=bus.clock)
    return app.test_client()


def signed_in(bus: Bus, **config: Any) -> FlaskClient:
    browser = client(bus, **config)
    answer = browser.get(f"/?token={TOKEN}", base_url=f"http://{HOST}")
    assert answer.status_code == 302
    return browser


def get(browser: FlaskClient, path: str, **kw: Any) -> Any:
    return browser.get(path, base_url=f"http://{HOST}", **kw)


def test_the_local_token_becomes_a_strict_http_only_cookie(bus: Bus) -> None:
    browser = client(bus)
    assert get(browser, "/").status_code == 401
    assert get(browser, "/?token=wrong").status_code == 401
    answer = get(browser, f"/failed?token={TOKEN}&type=X")
    assert answer.status_code == 302 and answer.headers["Location"] == "/failed?type=X"
    cookie = answer.headers["Set-Cookie"]
    assert f"{COOKIE}={TOKEN}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    page = get(browser, "/")
    assert page.status_code == 200 and b"eventbus console" in page.data
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["Referrer-Policy"] == "same-origin"


def test_a_non_loopback_host_is_refused(bus: Bus) -> None:
    browser = client(bus)
    answer = browser.get(f"/?token={TOKEN}", base_url="http://evil.example:8081")
    assert answer.status_code == 403


def test_pages_show_counts_groups_events_and_history(bus: Bus) -> None:
    ok = bus.deliver(tag="fine").key
    failed = bus.deliver(mode="permanent", orderId=4242, tag="f").key
    browser = signed_in(bus)
    overview = get(browser, "/").get_data(as_text=True)
    assert '<svg class="chart" id="throughput"' in overview and "FAILED(final)" in overview
    groups = get(browser, "/failed").get_data(as_text=True)
    assert "no such order &lt;number&gt;" in groups and "Replay group" in groups
    event = get(browser, "/event", query_string={"key": failed}).get_data(as_text=True)
    assert 'id="timeline"' in event and "PermanentError" in event and 'id="replay-link"' in event
    history = get(browser, "/partner", query_string={"id": "p-1"}).get_data(as_text=True)
    assert ok in history and failed in history
    assert get(browser, "/event", query_string={"key": "nope"}).status_code == 404
    assert get(browser, "/static/console.css").status_code == 200


def test_a_script_in_a_payload_is_shown_escaped(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId="<script>alert(1)</script>", tag="x",
                      partner="<img src=x onerror=alert(2)>").key
    browser = signed_in(bus)
    for path, query in (("/event", {"key": key}), ("/failed", {}),
                        ("/partner", {"id": "<img src=x onerror=alert(2)>"})):
        page = get(browser, path, query_string=query).get_data(as_text=True)
        assert "<script>alert" not in page and "<img src=x" not in page, path
    event = get(browser, "/event", query_string={"key": key}).get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in event


def test_replay_needs_the_csrf_token_and_a_same_origin_post(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="csrf").key
    browser = signed_in(bus)
    confirm = get(browser, "/replay", query_string={"key": key}).get_data(as_text=True)
    csrf = confirm.split('name="csrf" value="')[1].split('"')[0]
    assert 'id="confirm-replay"' in confirm and len(csrf) == 64
    post = {"key": key, "why": "test"}
    assert browser.post("/replay", data=post, base_url=f"http://{HOST}").status_code == 403
    assert browser.post("/replay", data={**post, "csrf": "0" * 64},
                        base_url=f"http://{HOST}").status_code == 403
    assert browser.post("/replay", data={**post, "csrf": csrf}, base_url=f"http://{HOST}",
                        headers={"Origin": "http://evil.example"}).status_code == 403
    assert bus.publisher.messages == []
    stranger = client(bus)
    assert stranger.post("/replay", data={**post, "csrf": csrf},
                         base_url=f"http://{HOST}").status_code == 401
    done = browser.post("/replay", data={**post, "csrf": csrf}, base_url=f"http://{HOST}",
                        headers={"Origin": f"http://{HOST}"})
    assert done.status_code == 200 and b'<td class="outcome">replayed</td>' in done.data
    record = bus.store.get(key)
    assert record is not None and record["replays"][0]["by"] == "local operator"
    FIXED.add("csrf")
    bus.replayed()
    assert bus.store.get(key)["event_status"] == "SUCCESS"


def test_a_group_is_replayed_after_confirmation(bus: Bus) -> None:
    keys = [bus.deliver(mode="permanent", orderId=1000 + n, tag=f"g{n}").key for n in range(3)]
    browser = signed_in(bus)
    groups = get(browser, "/failed").get_data(as_text=True)
    group = groups.split("/replay?group=")[1].split('"')[0]
    confirm = get(browser, f"/replay?group={group}").get_data(as_text=True)
    assert "Replay 3 events" in confirm
    csrf = confirm.split('name="csrf" value="')[1].split('"')[0]
    done = browser.post("/replay", data={"group": group, "csrf": csrf},
                        base_url=f"http://{HOST}")
    assert done.get_data(as_text=True).count("replayed</td>") == 3
    assert sorted(m.attributes["idempotency_key"] for m in bus.publisher.messages) == sorted(
        bus.store.get(k)["pubsub"]["attributes"]["idempotency_key"] for k in keys)


def test_read_only_hides_and_refuses_replay(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="ro").key
    browser = signed_in(bus, read_only=True)
    event = get(browser, "/event", query_string={"key": key}).get_data(as_text=True)
    assert 'id="replay-link"' not in event and "read-only" in event
    assert get(browser, "/replay", query_string={"key": key}).status_code == 403
    assert browser.post("/replay", data={"key": key},
                        base_url=f"http://{HOST}").status_code == 403


def test_signed_modes_fail_closed_without_an_allow_list() -> None:
    with pytest.raises(SettingsError, match="fails closed"):
        ConsoleConfig(auth="iap", audience=AUDIENCE)
    with pytest.raises(SettingsError, match="fails closed"):
        ConsoleConfig(auth="oidc", operators=(OPERATOR,))
    with pytest.raises(SettingsError, match="token"):
        ConsoleConfig()


# -- signed identities --------------------------------------------------------------------

def certificate(key: Any, name: str) -> str:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def pem(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


EC_KEY = ec.generate_private_key(ec.SECP256R1())
IAP_SIGNER = crypt.ES256Signer.from_string(pem(EC_KEY), key_id="iap-1")
IAP_CERTS = {"iap-1": certificate(EC_KEY, "iap")}
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OIDC_SIGNER = crypt.RSASigner.from_string(pem(RSA_KEY), key_id="g-1")
OIDC_CERTS = {"g-1": certificate(RSA_KEY, "google")}


def token(signer: Any, **claims: Any) -> str:
    now = int(time.time())
    body = {"iat": now, "exp": now + 600, "sub": "1", **claims}
    return jwt.encode(signer, body).decode()


def iap(email: str = OPERATOR, **changes: Any) -> str:
    return token(IAP_SIGNER, **{"iss": IAP_ISSUER, "aud": AUDIENCE, "email": email, **changes})


def test_iap_signed_header_against_the_allow_list(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="iap").key
    browser = client(bus, auth="iap", token="", audience=AUDIENCE, operators=(OPERATOR,),
                     certs=lambda: IAP_CERTS)
    url = "https://console.example.com"
    assert browser.get("/", base_url=url).status_code == 401
    assert browser.get("/", base_url=url, headers={IAP_HEADER: iap()}).status_code == 200
    assert browser.get("/", base_url=url,
                       headers={IAP_HEADER: iap("eve@example.com")}).status_code == 403
    assert browser.get("/", base_url=url,
                       headers={IAP_HEADER: iap(aud="/projects/9/x")}).status_code == 401
    assert browser.get("/", base_url=url,
                       headers={IAP_HEADER: iap(iss="https://accounts.google.com")}
                       ).status_code == 401
    forged = token(OIDC_SIGNER, iss=IAP_ISSUER, aud=AUDIENCE, email=OPERATOR)
    assert browser.get("/", base_url=url, headers={IAP_HEADER: forged}).status_code == 401
    headers = {IAP_HEADER: iap()}
    confirm = browser.get(f"/replay?key={key}", base_url=url, headers=headers)
    csrf = confirm.get_data(as_text=True).split('name="csrf" value="')[1].split('"')[0]
    done = browser.post("/replay", base_url=url, headers=headers,
                        data={"key": key, "csrf": csrf})
    assert done.status_code == 200
    assert bus.store.get(key)["replays"][0]["by"] == OPERATOR


def test_oidc_bearer_against_the_allow_list(bus: Bus) -> None:
    browser = client(bus, auth="oidc", token="", audience="https://console.example.com",
                     operators=(OPERATOR,), certs=lambda: OIDC_CERTS)
    good = token(OIDC_SIGNER, iss="https://accounts.google.com",
                 aud="https://console.example.com", email=OPERATOR, email_verified=True)
    url = "https://console.example.com"
    assert browser.get("/", base_url=url).status_code == 401
    ok = browser.get("/", base_url=url, headers={"Authorization": f"Bearer {good}"})
    assert ok.status_code == 200 and OPERATOR in ok.get_data(as_text=True)
    other = token(OIDC_SIGNER, iss="https://accounts.google.com",
                  aud="https://console.example.com", email="eve@example.com",
                  email_verified=True)
    assert browser.get("/", base_url=url,
                       headers={"Authorization": f"Bearer {other}"}).status_code == 403


def test_the_console_mounts_into_the_service_app(bus: Bus) -> None:
    from eventbus.web.app import create_app
    from tests.ops.conftest import routes

    app = create_app(routes, bus.settings, bus.store, now=bus.clock, publisher=bus.publisher)
    mount_console(app, ConsoleConfig(token=TOKEN), publisher=lambda: bus.publisher)
    browser = app.test_client()
    assert browser.get("/console/", base_url=f"http://{HOST}").status_code == 401
    answer = browser.get(f"/console/?token={TOKEN}", base_url=f"http://{HOST}")
    assert answer.status_code == 302 and answer.headers["Location"] == "/console/"
    assert "Path=/console/" in answer.headers["Set-Cookie"]
    assert browser.get("/console/", base_url=f"http://{HOST}").status_code == 200
    assert browser.get("/health").status_code == 200


def test_a_refused_event_is_corrected_in_the_form_and_runs_under_its_own_key(bus: Bus) -> None:
    typo = bus.deliver("OR_MGTM", key="order-90", tag="console-fix")
    done = bus.deliver(tag="fine")
    browser = signed_in(bus)
    confirm = get(browser, "/replay", query_string={"key": typo.key}).get_data(as_text=True)
    assert 'id="correction"' in confirm and "OR_MGTM" in confirm
    csrf = confirm.split('name="csrf" value="')[1].split('"')[0]
    fixed = json.dumps({"event_type": "OR_MGMT", "entity_metadata": {
        "partnerId": "p-1", "entity_id": "order-90", "entity_type": "Order"},
        "entity_data": {"tag": "console-fix"}})

    def post(key: str, data: str) -> Any:
        return browser.post("/replay", data={"key": key, "csrf": csrf, "data": data,
                                             "why": "typo"}, base_url=f"http://{HOST}")

    assert post(typo.key, "{not json").status_code == 400
    assert post(done.key, fixed).status_code == 409  # it ran: nothing to correct
    answer = post(typo.key, fixed)
    assert answer.status_code == 200 and b'<td class="outcome">replayed</td>' in answer.data
    FIXED.add("console-fix")
    (processed,) = bus.replayed()
    assert (processed.outcome.value, processed.key) == ("processed", typo.key)
    record = bus.store.get(typo.key) or {}
    assert record["event_type"] == "OR_MGMT" and record["rejections"][0]["event_type"] == "OR_MGTM"
    assert record["replays"][0]["by"] == "local operator"


# -- `eventbus console` honours EVENTBUS_CONSOLE_AUTH ----------------------------------------

def served(bus: Bus, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str, Any]:
    """Run `eventbus console`; return its exit code, output and the app it would serve."""
    apps: list[Any] = []
    monkeypatch.setattr("eventbus.web.console.serve", lambda app, host, port: apps.append(app))
    # The app outlives bus.run's own patches: keep its store and publisher for the test.
    monkeypatch.setattr(cli, "open_store", lambda settings: bus.store)
    monkeypatch.setattr(cli, "publisher", lambda settings, timeout=30.0: bus.publisher)
    code, out, err = bus.run("console", *argv)
    return code, out, err, apps[0] if apps else None


def test_the_console_command_serves_iap_identities_only(bus: Bus,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="cli-iap").key
    monkeypatch.setenv("EVENTBUS_CONSOLE_AUTH", "iap")
    monkeypatch.setenv("EVENTBUS_CONSOLE_AUDIENCE", AUDIENCE)
    monkeypatch.setenv("EVENTBUS_CONSOLE_OPERATORS", OPERATOR)
    monkeypatch.setenv("EVENTBUS_CONSOLE_TOKEN", TOKEN)
    monkeypatch.setattr("eventbus.web.console.access.fetch_certs", lambda url: IAP_CERTS)
    code, out, _, app = served(bus, monkeypatch, "--host", "0.0.0.0")
    assert code == 0 and TOKEN not in out and "?token" not in out
    browser, url = app.test_client(), "https://console.example.com"
    assert browser.get(f"/?token={TOKEN}", base_url=f"http://{HOST}").status_code == 401
    headers = {IAP_HEADER: iap()}
    assert browser.get("/", base_url=url, headers=headers).status_code == 200
    confirm = browser.get(f"/replay?key={key}", base_url=url, headers=headers)
    csrf = confirm.get_data(as_text=True).split('name="csrf" value="')[1].split('"')[0]
    assert browser.post("/replay", base_url=url, headers=headers,
                        data={"key": key, "csrf": csrf}).status_code == 200
    assert bus.store.get(key)["replays"][0]["by"] == OPERATOR


@pytest.mark.parametrize(("env", "argv"), [
    ({"EVENTBUS_CONSOLE_AUTH": "saml"}, ()),
    ({"EVENTBUS_CONSOLE_AUTH": "iap", "EVENTBUS_CONSOLE_AUDIENCE": AUDIENCE}, ()),
    ({"EVENTBUS_CONSOLE_AUTH": "oidc", "EVENTBUS_CONSOLE_OPERATORS": OPERATOR}, ()),
    ({}, ("--host", "0.0.0.0")),
])
def test_a_console_auth_it_cannot_honour_refuses_to_start(
        bus: Bus, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        argv: tuple[str, ...]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err, app = served(bus, monkeypatch, *argv)
    assert code == 2 and app is None and len(err.strip().splitlines()) == 1


def test_the_local_console_records_the_operator_and_logs_no_token(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTBUS_CONSOLE_TOKEN", TOKEN)
    code, out, _, app = served(bus, monkeypatch)
    assert code == 0 and TOKEN not in out and "?token=<EVENTBUS_CONSOLE_TOKEN>" in out
    key = bus.deliver(mode="permanent", orderId=1, tag="cli-local").key
    browser = app.test_client()
    assert get(browser, f"/?token={TOKEN}").status_code == 302
    confirm = get(browser, "/replay", query_string={"key": key}).get_data(as_text=True)
    csrf = confirm.split('name="csrf" value="')[1].split('"')[0]
    browser.post("/replay", data={"key": key, "csrf": csrf}, base_url=f"http://{HOST}")
    assert bus.store.get(key)["replays"][0]["by"] == "ops@example.com"  # EVENTBUS_OPERATOR


def test_werkzeug_access_lines_never_carry_the_token(caplog: pytest.LogCaptureFixture) -> None:
    from werkzeug.serving import make_server

    from eventbus.web.console.serving import RedactingHandler

    app = flask.Flask("probe")
    app.add_url_rule("/", "home", lambda: "ok")
    server = make_server("127.0.0.1", 0, app, request_handler=RedactingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    caplog.set_level(logging.INFO, "werkzeug")
    logging.getLogger("werkzeug").addHandler(caplog.handler)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/?a=1&token={TOKEN}") as r:
            assert r.status == 200
    finally:
        logging.getLogger("werkzeug").removeHandler(caplog.handler)
        server.shutdown()
    assert "GET /?a=1&token=*** HTTP" in caplog.text and TOKEN not in caplog.text


def test_the_event_page_shows_what_was_forwarded_where(bus: Bus) -> None:
    key = bus.deliver("SUB_MGMT").key
    published = {"idempotency_key": f"{key}>order-status@v1", "kind": "public",
                 "topic": "order-status", "contract": "order-status", "contract_version": "v1",
                 "status": "PUBLISHED", "messageId": "msg-77", "published_at": bus.clock()}
    refused = {**published, "idempotency_key": f"{key}>order-status@v2",
               "contract_version": "v2", "status": "FAILED", "messageId": None,
               "error": {"message": "line_items: <b>not a list</b>"}}
    bus.store.collection.update_one({"idempotency_key": key},
                                    {"$set": {"outbox": [published, refused]}})
    page = get(signed_in(bus), "/event", query_string={"key": key}).get_data(as_text=True)
    section = page[page.index('id="forwards"'):]
    assert "order-status@v1" in section and "msg-77" in section and "PUBLISHED" in section
    assert "order-status@v2" in section and "FAILED" in section
    assert "&lt;b&gt;not a list&lt;/b&gt;" in section and "<b>not a list" not in page
