"""Who may use the console: a local token, or a verified Google identity on an allow-list.

* ``local`` (``eventbus console``): the server binds 127.0.0.1 and answers
  only requests whose ``Host`` is a loopback name (no DNS rebinding); the
  first visit carries ``?token=``, which becomes an HttpOnly, SameSite=Strict
  cookie, and every later request needs that cookie.
* ``iap``: behind Identity-Aware Proxy, the ``x-goog-iap-jwt-assertion``
  header, signed by IAP (ES256), checked for its audience and issuer.
* ``oidc``: an ``Authorization: Bearer`` Google ID token (``eventbus.pubsub.push_auth``).

In both signed modes the token's e-mail must be on the operators'
allow-list, which may not be empty (fail closed). Replays are POSTs that
carry a CSRF token bound to the operator (an HMAC of the identity).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests
from google.auth import exceptions as google_exceptions
from google.auth import jwt

from eventbus.model.errors import Forbidden, Unauthenticated
from eventbus.pubsub.push_auth import Authenticator, fetch_certs

IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
IAP_ISSUER = "https://cloud.google.com/iap"
IAP_HEADER = "x-goog-iap-jwt-assertion"
COOKIE = "eventbus_console"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
CertsFetcher = Callable[[], Mapping[str, str]]


class IapVerifier:
    """Verifies IAP's signed header and the operator's e-mail; certificates are cached."""

    def __init__(self, audience: str, operators: Sequence[str],
                 certs: CertsFetcher | None = None, cache_seconds: float = 3600) -> None:
        self.audience, self.operators = audience, tuple(operators)
        self._fetch = certs or (lambda: fetch_certs(IAP_CERTS_URL))
        self._cache_seconds = cache_seconds
        self._certs: Mapping[str, str] = {}
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()

    def verify(self, assertion: str) -> str:
        """Return the operator's e-mail, or raise ``Unauthenticated``/``Forbidden``."""
        if not assertion:
            raise Unauthenticated(f"missing {IAP_HEADER}")
        try:
            claims = jwt.decode(assertion, certs=self._current(), audience=self.audience)
        except (ValueError, google_exceptions.GoogleAuthError) as exc:
            raise Unauthenticated(f"invalid IAP assertion: {exc}") from None
        if claims.get("iss") != IAP_ISSUER:
            raise Unauthenticated(f"unexpected issuer {claims.get('iss')!r}")
        return allowed(claims.get("email"), self.operators)

    def _current(self) -> Mapping[str, str]:
        with self._lock:
            if time.monotonic() - self._fetched_at > self._cache_seconds:
                try:
                    self._certs, self._fetched_at = self._fetch(), time.monotonic()
                except (requests.RequestException, ValueError) as exc:
                    if not self._certs:
                        raise Unauthenticated(f"cannot fetch IAP keys: {exc}") from None
            return self._certs


class OidcVerifier:
    """Verifies a Google ID token (``Authorization: Bearer``) and the operator's e-mail."""

    def __init__(self, audience: str, operators: Sequence[str],
                 certs: CertsFetcher | None = None) -> None:
        self.operators = tuple(operators)
        self._authenticator = (Authenticator(audience, self.operators, certs=certs) if certs
                               else Authenticator(audience, self.operators))

    def verify(self, authorization: str) -> str:
        """Return the operator's e-mail, or raise ``Unauthenticated``/``Forbidden``."""
        claims = self._authenticator.verify(authorization)
        return allowed(claims.get("email"), self.operators)


def allowed(email: Any, operators: Sequence[str]) -> str:
    """Return ``email`` when it is on the allow-list, else raise ``Forbidden``."""
    if not isinstance(email, str) or email.lower() not in {o.lower() for o in operators}:
        raise Forbidden(f"{email!r} is not an operator of this console")
    return email


def loopback(host: str) -> bool:
    """Return True when a ``Host`` header names this machine's loopback interface."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.lower() in LOOPBACK_HOSTS


def same_token(given: str | None, expected: str) -> bool:
    """Compare tokens in constant time; an empty token never matches."""
    return bool(given) and bool(expected) and hmac.compare_digest(
        str(given).encode(), expected.encode())


def csrf_token(secret: bytes, identity: str) -> str:
    """Return the CSRF token of ``identity``: an HMAC under the console's secret."""
    return hmac.new(secret, f"csrf|{identity}".encode(), hashlib.sha256).hexdigest()


def csrf_valid(secret: bytes, identity: str, given: str | None) -> bool:
    """Return True when ``given`` is ``identity``'s CSRF token."""
    return same_token(given, csrf_token(secret, identity))
