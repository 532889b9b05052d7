"""OIDC authentication of push requests, as Pub/Sub signs them.

Pub/Sub puts ``Authorization: Bearer <JWT>`` on each push when the
subscription has a push service account. We check the signature against
Google's certificates, ``aud``, ``exp``, the issuer, the expected
service-account ``email`` and ``email_verified``. Certificates are cached,
so a request costs no network call once they are fetched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests
from google.auth import exceptions as google_exceptions
from google.auth import jwt

from eventbus.model.errors import Forbidden, Unauthenticated

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
ISSUERS = ("accounts.google.com", "https://accounts.google.com")
CertsFetcher = Callable[[], Mapping[str, str]]


def fetch_certs(url: str = GOOGLE_CERTS_URL, timeout: float = 5.0) -> Mapping[str, str]:
    """Return the ``kid`` → PEM certificate map published at ``url``."""
    response = requests.get(url, timeout=timeout)
    response.raise_for_status()
    certs: Mapping[str, str] = response.json()
    return certs


class Authenticator:
    """Verifies the bearer token of a push request, or raises 401/403 errors."""

    def __init__(self, audience: str, service_accounts: Sequence[str],
                 certs: CertsFetcher = fetch_certs, cache_seconds: float = 3600,
                 clock_skew_seconds: int = 10) -> None:
        self.audience, self.service_accounts = audience, tuple(service_accounts)
        self._fetch, self._cache_seconds, self._skew = certs, cache_seconds, clock_skew_seconds
        self._certs: Mapping[str, str] = {}
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()

    def verify(self, authorization: str) -> Mapping[str, Any]:
        """Return the token's claims if the push may be processed."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("missing 'Authorization: Bearer <token>'")
        claims = self._decode(token.strip())
        self._check_identity(claims)
        return claims

    def _decode(self, token: str) -> Mapping[str, Any]:
        try:
            claims: Mapping[str, Any] = jwt.decode(token, certs=self._current_certs(),
                                                   audience=self.audience,
                                                   clock_skew_in_seconds=self._skew)
        except (ValueError, google_exceptions.GoogleAuthError) as exc:
            raise Unauthenticated(f"invalid token: {exc}") from None
        if claims.get("iss") not in ISSUERS:
            raise Unauthenticated(f"unexpected issuer {claims.get('iss')!r}")
        return claims

    def _check_identity(self, claims: Mapping[str, Any]) -> None:
        if claims.get("email_verified") is not True:
            raise Forbidden("token email is not verified")
        if self.service_accounts and claims.get("email") not in self.service_accounts:
            raise Forbidden(f"service account {claims.get('email')!r} may not push here")

    def _current_certs(self) -> Mapping[str, str]:
        with self._lock:
            if time.monotonic() - self._fetched_at > self._cache_seconds:
                try:
                    self._certs, self._fetched_at = self._fetch(), time.monotonic()
                except (requests.RequestException, ValueError) as exc:
                    if not self._certs:
                        raise Unauthenticated(f"cannot fetch signing certificates: {exc}") \
                            from None
            return self._certs
