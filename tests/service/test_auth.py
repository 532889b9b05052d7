"""OIDC checks with tokens signed by a local key (the emulator has no auth)."""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import flask
import google.auth
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import create_app, push_target
from eventbus.http.deadline import DeadlineExceeded
from eventbus.model.errors import Forbidden, Unauthenticated
from eventbus.model.router import Router
from eventbus.pubsub.push_auth import Authenticator, CertificateCache, fetch_certs
from eventbus.settings import Settings, SettingsError
from eventbus.store.memory import MemoryEventStore
from handlers.settings import AppSettings
from tests.hypothesis_profiles import examples
from tests.partner_server import PartnerServer, Trickle
from tests.service.conftest import Make, event

AUDIENCE = "https://eventbus.example.run.app/"
PUSHER = "pubsub-push@project.iam.gserviceaccount.com"


def key_and_cert(kid: str) -> tuple[crypt.RSASigner, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, kid)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return (crypt.RSASigner.from_string(pem, key_id=kid),
            cert.public_bytes(serialization.Encoding.PEM).decode())


SIGNER, CERT = key_and_cert("kid-1")
OTHER_SIGNER, _ = key_and_cert("kid-1")


def token(signer: crypt.RSASigner = SIGNER, **changes: Any) -> str:
    now = int(time.time())
    claims = {"iss": "https://accounts.google.com", "aud": AUDIENCE, "iat": now,
              "exp": now + 600, "email": PUSHER, "email_verified": True, "sub": "1"}
    claims.update(changes)
    return jwt.encode(signer, {k: v for k, v in claims.items() if v is not None}).decode()


@pytest.fixture(scope="module")
def certs_url() -> Iterator[str]:
    body = json.dumps({"kid-1": CERT}).encode()

    class Certs(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Certs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/certs"
    server.shutdown()


@pytest.fixture()
def authenticator(certs_url: str) -> Authenticator:
    return Authenticator(AUDIENCE, [PUSHER], certs=lambda: fetch_certs(certs_url))


def test_a_valid_pubsub_token_passes(authenticator: Authenticator) -> None:
    claims = authenticator.verify(f"Bearer {token()}")
    assert claims["email"] == PUSHER


@pytest.mark.parametrize(("header", "error"), [
    ("", Unauthenticated), ("Basic abc", Unauthenticated), ("Bearer not-a-jwt", Unauthenticated),
    (f"Bearer {token(OTHER_SIGNER)}", Unauthenticated),
    (f"Bearer {token(aud='https://other/')}", Unauthenticated),
    (f"Bearer {token(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200)}", Unauthenticated),
    (f"Bearer {token(iss='https://evil.example')}", Unauthenticated),
    (f"Bearer {token(email='someone@else.com')}", Forbidden),
    (f"Bearer {token(email_verified=False)}", Forbidden),
], ids=["empty", "basic", "not-a-jwt", "other-signer", "other-audience", "expired",
        "other-issuer", "other-email", "unverified-email"])  # the tokens differ per process
def test_bad_tokens_are_refused(authenticator: Authenticator, header: str,
                                error: type[Exception]) -> None:
    with pytest.raises(error):
        authenticator.verify(header)


def test_the_endpoint_answers_401_and_403_and_processes_nothing(
        make_harness: Make, authenticator: Authenticator) -> None:
    h = make_harness(router=Router())
    h.app.extensions["eventbus"].authenticator = authenticator
    missing = h.push(event())
    wrong = h.client.post("/", json={}, headers={
        "Authorization": f"Bearer {token(email='x@y.z')}"})
    assert (missing.status_code, wrong.status_code) == (401, 403)
    assert missing.json["error"] == "unauthenticated" and wrong.json["error"] == "forbidden"
    assert h.store.summaries() == []


def test_certificates_are_fetched_once(certs_url: str) -> None:
    fetches: list[int] = []

    def counting() -> dict[str, str]:
        fetches.append(1)
        return dict(fetch_certs(certs_url))

    auth = Authenticator(AUDIENCE, [PUSHER], certs=counting)
    for _ in range(3):
        auth.verify(f"Bearer {token()}")
    assert len(fetches) == 1


# -- issue 10: fails closed, malformed tokens are 401, certificates back off ------------------

def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def segment(value: Any) -> str:
    return b64(json.dumps(value).encode())


MALFORMED = [
    pytest.param("Bearer a", id="one-segment"),
    pytest.param("Bearer a.b", id="two-segments"),
    pytest.param("Bearer a.b.c", id="three-bad-segments"),
    pytest.param("Bearer ....", id="only-dots"),
    pytest.param("Bearer eyJhbGciOiJSUzI1NiJ9.e30.x", id="bad-signature-no-kid"),
    pytest.param("Bearer eyJhbGciOiJSUzI1NiJ9.e30.xx", id="wrong-signature-no-kid"),
    pytest.param("Bearer a\udc80b.c.d", id="surrogate"),
    pytest.param("Bearer \u00e9\u00e9.\u00e9.\u00e9", id="non-ascii"),
    pytest.param("Bearer \u0436.b.c", id="cyrillic"),
    pytest.param("Bearer a\x00.b.c", id="nul"),
    pytest.param(f"Bearer {segment([1, 2])}.e30.xx", id="header-json-is-a-list"),
    pytest.param(f"Bearer {segment('text')}.e30.xx", id="header-json-is-a-string"),
    pytest.param(f"Bearer {segment(None)}.e30.xx", id="header-json-is-null"),
    pytest.param(f"Bearer {segment({'alg': 'RS256', 'kid': 'kid-1'})}.{segment([])}.xx",
                 id="payload-json-is-a-list"),
    pytest.param(f"Bearer {segment({'alg': ['RS256']})}.e30.xx", id="alg-is-a-list"),
    pytest.param(f"Bearer {segment({'alg': {}})}.e30.xx", id="alg-is-an-object"),
    pytest.param(f"Bearer {segment({'alg': 'RS256', 'kid': ['kid-1']})}.e30.xx",
                 id="kid-is-a-list"),
    pytest.param(f"Bearer {segment({'alg': 'RS256', 'kid': 'nope'})}.e30.xx", id="unknown-kid"),
    pytest.param(f"Bearer {segment({'alg': 'none'})}.e30.", id="alg-none"),
    pytest.param(f"Bearer {segment({'alg': 'ES256'})}.e30.xx", id="alg-mismatch"),
    pytest.param(f"Bearer {b64(b'[' * 6000 + b']' * 6000)}.e30.xx", id="header-nested-deep"),
    pytest.param(f"Bearer {b64(bytes([0xFF, 0xFE]))}.e30.xx", id="header-not-utf8"),
    pytest.param("Bearer " + "x" * 10_000, id="10kB-junk"),
    pytest.param("Bearer " + "a." * 5_000 + "a", id="10kB-of-dots"),
    pytest.param("Bearer " + "A" * 200_000, id="200kB"),
]


@pytest.mark.parametrize("header", MALFORMED)
def test_malformed_tokens_are_unauthenticated(authenticator: Authenticator, header: str) -> None:
    with pytest.raises(Unauthenticated) as refused:
        authenticator.verify(header)
    assert refused.value.status == 401 and len(str(refused.value)) < 200


@pytest.mark.parametrize("header", [p for p in MALFORMED
                                    if all(ord(c) < 256 for c in p.values[0])])
def test_malformed_tokens_get_401_over_http(make_harness: Make, authenticator: Authenticator,
                                            header: str) -> None:
    h = make_harness(router=Router())
    h.app.extensions["eventbus"].authenticator = authenticator
    response = h.client.post("/", json={"message": {"data": "e30=", "messageId": "1"}},
                             headers={"Authorization": header})
    assert response.status_code == 401 and response.json["error"] == "unauthenticated"
    assert "Traceback" not in response.get_data(as_text=True)
    assert h.store.summaries() == []


token_text = st.text(max_size=60) | st.text(
    st.characters(categories=("L", "N", "P", "S", "Zs", "Cc", "Cs")), max_size=60)
json_segment = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**100), 2**100) | st.floats() | token_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["alg", "kid", "typ", "iss", "aud", "exp", "iat", "email"]) | token_text,
        inner, max_size=4),
    max_leaves=8)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(
    token_text.map(lambda t: f"Bearer {t}"),
    st.tuples(json_segment, json_segment, st.binary(max_size=300)).map(
        lambda parts: "Bearer " + ".".join([segment(parts[0]), segment(parts[1]),
                                            b64(parts[2])])),
    st.tuples(st.binary(max_size=100), st.binary(max_size=100), token_text).map(
        lambda parts: f"Bearer {b64(parts[0])}.{b64(parts[1])}.{parts[2]}"),
    token_text))
def test_any_authorization_header_is_a_401_or_403(header: str) -> None:
    auth = Authenticator(AUDIENCE, [PUSHER], certs=CertificateCache(lambda: {"kid-1": CERT}))
    with pytest.raises((Unauthenticated, Forbidden)):
        auth.verify(header)


def test_the_installed_google_auth_meets_the_floor() -> None:
    version = tuple(int(part) for part in google.auth.__version__.split(".")[:3])
    assert version >= (2, 62, 2)


@pytest.mark.parametrize(("environ", "missing"), [
    ({"EVENTBUS_AUTH": "true", "EVENTBUS_AUTH_AUDIENCE": AUDIENCE},
     "EVENTBUS_AUTH_SERVICE_ACCOUNTS"),
    ({"EVENTBUS_AUTH": "true", "EVENTBUS_AUTH_AUDIENCE": AUDIENCE,
      "EVENTBUS_AUTH_SERVICE_ACCOUNTS": " , ,"}, "EVENTBUS_AUTH_SERVICE_ACCOUNTS"),
    ({"EVENTBUS_AUTH": "true", "EVENTBUS_AUTH_SERVICE_ACCOUNTS": PUSHER},
     "EVENTBUS_AUTH_AUDIENCE"),
    ({"EVENTBUS_AUTH": "true"}, "EVENTBUS_AUTH_SERVICE_ACCOUNTS and EVENTBUS_AUTH_AUDIENCE"),
])
def test_auth_on_without_an_allow_list_is_a_start_up_error(environ: dict[str, str],
                                                           missing: str) -> None:
    with pytest.raises(SettingsError, match=f"EVENTBUS_AUTH is on but {missing}"):
        Settings.from_env(environ)
    with pytest.raises(SettingsError, match="fails closed"):
        AppSettings.from_env(environ)


def test_create_app_refuses_to_start_with_auth_on_and_no_allow_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTBUS_AUTH", "true")
    monkeypatch.setenv("EVENTBUS_AUTH_AUDIENCE", AUDIENCE)
    monkeypatch.delenv("EVENTBUS_AUTH_SERVICE_ACCOUNTS", raising=False)
    with pytest.raises(SettingsError, match="EVENTBUS_AUTH_SERVICE_ACCOUNTS"):
        create_app(Router(), store=MemoryEventStore())
    with pytest.raises(SettingsError, match="fails closed"):
        create_app(Router(), Settings(auth_enabled=True, auth_audience=AUDIENCE),
                   MemoryEventStore())


def test_auth_settings_that_are_complete_start() -> None:
    settings = Settings.from_env({"EVENTBUS_AUTH": "true", "EVENTBUS_AUTH_AUDIENCE": AUDIENCE,
                                  "EVENTBUS_AUTH_SERVICE_ACCOUNTS": f"{PUSHER}, other@x.iam"})
    assert settings.auth_service_accounts == (PUSHER, "other@x.iam")
    assert Settings(auth_enabled=False).auth_service_accounts == ()


@pytest.mark.parametrize(("audience", "accounts"), [
    (AUDIENCE, []), (AUDIENCE, [""]), (AUDIENCE, ["  "]), ("", [PUSHER]), (" ", [PUSHER]),
    (AUDIENCE, PUSHER)])
def test_the_authenticator_refuses_an_empty_allow_list(audience: str, accounts: Any) -> None:
    with pytest.raises(SettingsError, match=r"fails closed|not one string"):
        Authenticator(audience, accounts, certs=lambda: {"kid-1": CERT})


def test_an_account_outside_the_allow_list_is_forbidden(authenticator: Authenticator) -> None:
    with pytest.raises(Forbidden):
        authenticator.verify(f"Bearer {token(email=PUSHER + '.evil.example')}")
    with pytest.raises(Forbidden):
        authenticator.verify(f"Bearer {token(email=None)}")


def test_a_401_body_echoes_neither_the_token_nor_the_audience(
        make_harness: Make, authenticator: Authenticator) -> None:
    h = make_harness(router=Router())
    h.app.extensions["eventbus"].authenticator = authenticator
    junk = "x" * 5000
    wrong_audience = token(aud="https://other/")
    for header in (f"Bearer {junk}", f"Bearer {wrong_audience}"):
        text = h.client.post("/", json={}, headers={"Authorization": header}).get_data(
            as_text=True)
        assert junk[:50] not in text and AUDIENCE not in text and "other" not in text


class Monotonic:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FlakyFetcher:
    """Returns the certificates, or raises, as scripted; counts its calls."""

    def __init__(self, script: list[bool]) -> None:
        self.script, self.calls = script, 0

    def __call__(self) -> dict[str, str]:
        ok = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if not ok:
            raise requests.ConnectionError("certs host unreachable")
        return {"kid-1": CERT}


def test_an_expired_cache_keeps_serving_stale_certificates_and_backs_off() -> None:
    clock, fetch = Monotonic(), FlakyFetcher([True, False])
    cache = CertificateCache(fetch, cache_seconds=60, monotonic=clock)
    auth = Authenticator(AUDIENCE, [PUSHER], certs=cache)
    assert auth.verify(f"Bearer {token()}")["email"] == PUSHER and fetch.calls == 1
    clock.now += 61  # expired; every fetch from now on fails
    for _ in range(50):
        assert auth.verify(f"Bearer {token()}")["email"] == PUSHER  # stale certs still verify
    assert fetch.calls == 2 and cache.failures == 1
    delays = []
    for _ in range(12):  # move to each retry time: one fetch per step, the delay doubles
        delays.append(cache.retry_at - clock.now)
        clock.now = cache.retry_at
        auth.verify(f"Bearer {token()}")
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert fetch.calls == 14


def test_a_successful_refetch_resets_the_backoff() -> None:
    clock, fetch = Monotonic(), FlakyFetcher([True, False, False, True, False])
    cache = CertificateCache(fetch, cache_seconds=60, monotonic=clock)
    cache.current()
    clock.now += 61
    cache.current()
    clock.now = cache.retry_at
    cache.current()
    assert cache.failures == 2
    clock.now = cache.retry_at
    assert cache.current() == {"kid-1": CERT} and cache.failures == 0
    clock.now += 59
    cache.current()
    assert fetch.calls == 4  # fresh again for a full cache period
    clock.now += 2
    cache.current()
    assert cache.failures == 1 and cache.retry_at - clock.now == 1


def test_with_no_certificates_at_all_requests_get_401_and_fetches_back_off(
        make_harness: Make) -> None:
    clock, fetch = Monotonic(), FlakyFetcher([False])
    auth = Authenticator(AUDIENCE, [PUSHER],
                         certs=CertificateCache(fetch, monotonic=clock))
    h = make_harness(router=Router())
    h.app.extensions["eventbus"].authenticator = auth
    answers = {h.client.post("/", json={}, headers={"Authorization": f"Bearer {token()}"})
               .status_code for _ in range(20)}
    assert answers == {401} and fetch.calls == 1
    clock.now += 1
    with pytest.raises(Unauthenticated, match="not available"):
        auth.verify(f"Bearer {token()}")
    assert fetch.calls == 2


@pytest.mark.parametrize("bad", [{}, {"kid-1": 5}, ["kid-1"]])
def test_a_fetch_that_returns_garbage_counts_as_a_failure(bad: Any) -> None:
    clock = Monotonic()
    cache = CertificateCache(lambda: bad, monotonic=clock)
    assert cache.current() == {} and cache.failures == 1


def test_the_functions_target_refuses_unauthenticated_pushes(
        make_harness: Make, authenticator: Authenticator) -> None:
    h = make_harness(router=None, auth_enabled=True, auth_audience=AUDIENCE,
                     auth_service_accounts=(PUSHER,))
    target = push_target(h.app)
    service = h.app.extensions["eventbus"]
    assert service.authenticator is not None  # the settings turned auth on for both targets
    service.authenticator = authenticator  # the same, with local certificates
    body = json.dumps({"message": {"data": base64.b64encode(json.dumps(event()).encode())
                                   .decode(), "messageId": "f-1"}, "subscription": "s"})
    cases = [({}, 401), ({"Authorization": "Bearer a.b.c"}, 401),
             ({"Authorization": f"Bearer {token(email='x@y.z')}"}, 403),
             ({"Authorization": f"Bearer {token()}"}, 200)]
    for headers, status in cases:
        with h.app.test_request_context("/", method="POST", data=body, headers=headers,
                                        content_type="application/json"):
            response = target(flask.request)
        assert response.status_code == status, response.get_json()
    assert len(h.store.summaries()) == 1


def test_a_trickling_certificate_endpoint_ends_within_the_total_deadline() -> None:
    with PartnerServer([Trickle(every=0.5)]) as slow:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="within 1 s"):
            fetch_certs(slow.url + "/certs", timeout=1.0)
        took = time.monotonic() - started
    assert took < 1.0 + 0.5, f"the fetch took {took:.1f} s"
