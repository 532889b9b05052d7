"""OIDC checks with tokens signed by a local key (the emulator has no auth)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

from eventbus.model.errors import Forbidden, Unauthenticated
from eventbus.model.router import Router
from eventbus.pubsub.auth import Authenticator, fetch_certs
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
])
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
