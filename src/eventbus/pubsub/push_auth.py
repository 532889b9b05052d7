"""OIDC authentication of push requests, as Pub/Sub signs them.

Pub/Sub puts ``Authorization: Bearer <JWT>`` on each push when the
subscription has a push service account. We check the signature against
Google's certificates, ``aud``, ``exp``, the issuer, the expected
service-account ``email`` and ``email_verified``.

It fails closed: an ``Authenticator`` refuses to exist without an audience
and at least one allowed service account, and any token that cannot be
decoded (whatever ``google-auth`` raises for garbage) is a 401, never a 5xx.

Certificates are cached (``CertificateCache``), so a request costs no
network call once they are fetched. When a refresh fails, the cache keeps
serving the stale certificates and retries with exponential backoff (1 s
doubling up to 5 min by default) instead of refetching on every request;
with no certificates at all, requests get 401 until a fetch succeeds.
"""

from __future__ import annotations

import binascii
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.auth import exceptions as google_exceptions
from google.auth import jwt

from eventbus.http import deadline
from eventbus.model.errors import Forbidden, Unauthenticated
from eventbus.settings import SettingsError

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
ISSUERS = ("accounts.google.com", "https://accounts.google.com")
MAX_TOKEN_CHARS = 16 * 1024
"""A Google OIDC token is about 1 kB; anything far larger is refused before decoding."""
CertsFetcher = Callable[[], Mapping[str, str]]
Monotonic = Callable[[], float]
# What jwt.decode may raise for a token that is garbage: google-auth's own errors
# (MalformedError and InvalidValue are also ValueErrors), bad base64 (binascii),
# bad text (UnicodeError), odd header values (TypeError, KeyError), and JSON
# nested too deep (RecursionError).
_DECODE_ERRORS = (google_exceptions.GoogleAuthError, ValueError, TypeError, KeyError,
                  AttributeError, IndexError, OverflowError, UnicodeError, binascii.Error,
                  RecursionError)

logger = logging.getLogger("eventbus")


def fetch_certs(url: str = GOOGLE_CERTS_URL, timeout: float = 5.0) -> Mapping[str, str]:
    """Return the ``kid`` → PEM certificate map published at ``url``, within ``timeout`` in all."""
    with deadline.session() as http:
        response = deadline.request(http, "GET", url, total=timeout)
    response.raise_for_status()
    certs: Mapping[str, str] = response.json()
    return certs


class CertificateCache:
    """Google's signing certificates, refreshed when stale, with backoff when refreshing fails.

    ``monotonic`` is injected so tests move time without sleeping. Only one
    thread fetches at a time; while it does, the others keep using the stale
    certificates if there are any.
    """

    def __init__(self, fetch: CertsFetcher = fetch_certs, *, cache_seconds: float = 3600,
                 min_backoff: float = 1.0, max_backoff: float = 300.0,
                 monotonic: Monotonic = time.monotonic) -> None:
        self._fetch, self._cache_seconds, self._monotonic = fetch, cache_seconds, monotonic
        self._min_backoff, self._max_backoff = min_backoff, max_backoff
        self._certs: Mapping[str, str] = {}
        self._fresh_until = float("-inf")
        self._retry_at = float("-inf")
        self._failures = 0
        self._lock = threading.Lock()

    @property
    def failures(self) -> int:
        """Consecutive failed fetches since the last success."""
        return self._failures

    @property
    def retry_at(self) -> float:
        """The monotonic time before which no fetch is attempted (after a failure)."""
        return self._retry_at

    def current(self) -> Mapping[str, str]:
        """Return the certificates to verify with: fresh, stale, or none ({}) at all."""
        if not self._due():
            return self._certs
        # With stale certificates in hand, never queue behind another thread's fetch.
        if not self._lock.acquire(blocking=not self._certs):
            return self._certs
        try:
            if self._due():
                self._refresh()
            return self._certs
        finally:
            self._lock.release()

    def _due(self) -> bool:
        now = self._monotonic()
        return now >= self._fresh_until and now >= self._retry_at

    def _refresh(self) -> None:
        try:
            certs = dict(self._fetch())
            if not certs or not all(isinstance(k, str) and isinstance(v, str)
                                    for k, v in certs.items()):
                raise ValueError("the certificate map is empty or not kid -> PEM text")
        except Exception as exc:  # any failure of the fetcher: back off, keep what we have
            self._failed(exc)
            return
        self._certs, self._failures = certs, 0
        self._fresh_until, self._retry_at = self._monotonic() + self._cache_seconds, float("-inf")

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        delay = min(self._max_backoff, self._min_backoff * 2 ** min(self._failures - 1, 32))
        self._retry_at = self._monotonic() + delay
        logger.warning("cannot fetch token signing certificates (failure %d, next try in %.0f s, "
                       "%s): %s: %s", self._failures, delay,
                       "serving stale ones" if self._certs else "none to serve",
                       type(exc).__name__, exc)


class Authenticator:
    """Verifies the bearer token of a push request, or raises 401/403 errors."""

    def __init__(self, audience: str, service_accounts: Sequence[str],
                 certs: CertsFetcher | CertificateCache = fetch_certs,
                 cache_seconds: float = 3600, clock_skew_seconds: int = 10) -> None:
        if isinstance(service_accounts, str):
            raise SettingsError("service_accounts must be a sequence of e-mails, not one string")
        self.audience = audience.strip()
        self.service_accounts = tuple(a.strip() for a in service_accounts if a.strip())
        if not self.audience or not self.service_accounts:
            raise SettingsError("push auth fails closed: an audience and at least one allowed "
                                "service account are required")
        self.certs = certs if isinstance(certs, CertificateCache) \
            else CertificateCache(certs, cache_seconds=cache_seconds)
        self._skew = clock_skew_seconds

    def verify(self, authorization: str) -> Mapping[str, Any]:
        """Return the token's claims if the push may be processed."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("missing 'Authorization: Bearer <token>'")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("invalid token: too long")
        claims = self._decode(token.strip())
        self._check_identity(claims)
        return claims

    def _decode(self, token: str) -> Mapping[str, Any]:
        certs = self.certs.current()
        if not certs:
            raise Unauthenticated("token signing certificates are not available yet")
        try:
            claims: Mapping[str, Any] = jwt.decode(token, certs=dict(certs),
                                                   audience=self.audience,
                                                   clock_skew_in_seconds=self._skew)
        except _DECODE_ERRORS as exc:
            # Details go to the log only: they may name our audience or echo the token.
            logger.info("push token refused: %s: %.200s", type(exc).__name__, exc)
            raise Unauthenticated(f"invalid token ({type(exc).__name__})") from None
        if claims.get("iss") not in ISSUERS:
            raise Unauthenticated("invalid token: unexpected issuer")
        return claims

    def _check_identity(self, claims: Mapping[str, Any]) -> None:
        if claims.get("email_verified") is not True:
            raise Forbidden("token email is not verified")
        if claims.get("email") not in self.service_accounts:
            raise Forbidden(f"service account {_shown(claims.get('email'))} may not push here")


def _shown(value: Any) -> str:
    return repr(value[:120]) if isinstance(value, str) else f"of type {type(value).__name__}"
