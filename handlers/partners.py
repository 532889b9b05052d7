"""Partner HTTP calls, made at most once per event key through the library's guard.

A partner endpoint is a side effect the event store cannot make idempotent,
so each call runs inside ``context.guard`` (seed 004's "Idempotence For Side
Effects": key check, lease, call, key set), with the key in an
``Idempotency-Key`` header so a partner that deduplicates can do so too.

The partner's answer is classified by its status and recorded on the guard
record. Its body is read with ``eventbus.http.deadline``'s cap (1 MiB): a longer
body is cut there, and the answer is still classified by its status (which
came whole), as it was when such a body was read to the end. An answer that
is not HTTP as it should be (a hostile ``Content-Length``, conflicting ones)
is a failed call like a dropped connection:

* 2xx → the key is set for good (SUCCESS with ``status_code``);
* 408, 429, 5xx, other non-4xx answers, network errors, malformed answers
  and timeouts → ``PartnerUnavailable`` (transient): the event is retried;
  ``timeout`` is the whole call's deadline (connect, send and every read of
  the answer, ``eventbus.http.deadline``), so a partner that trickles its answer
  (over a kept-alive or a closing connection alike) cannot hold the request
  thread, or the event's lease, past it;
* any other 4xx, or a request that can never be sent (its URL) →
  ``PartnerRejected`` (permanent): stored FAILED for good.

**The HTTP client is the library's** (``eventbus.http.deadline.Client``): the
session the app gives (``handlers.create_router``'s, wrapped for logging) is
taken over when the client is built, its adapters made to honour the
deadline and the cap, or refused at start-up (``UnboundedSession``) when they
cannot. ``AsyncPartnerClient`` is the same call for async code, on httpx
(``eventbus.http.deadline_async``): the same request, deadline, cap and
classification.

**The ``Idempotency-Key`` header** (``idempotency_header``) is the event key
itself when the key is printable ASCII (``0x20``-``0x7E``) with no leading or
trailing whitespace, at most 200 characters, and does not start with
``sha256:``; any other key is sent as ``sha256:`` followed by the hex SHA-256
of its UTF-8 bytes (lone surrogates passed through, ``surrogatepass``). So
every key, Cyrillic or with a leading space or a NUL, gives a header that
HTTP can carry, and two different keys never share a header.

**The URL** (``partner_url``): the partner id is one path segment,
percent-encoded with ``quote(partner_id, safe="")``; an empty id, ``.``,
``..`` or text that is not valid Unicode is refused with ``BadPartnerId``
(permanent) before any call.

Everything the call needs (URL, header, body) is built inside the guarded
effect, so any failure, even one raised before the HTTP request, stores the
guard record FAILED and releases its lease.

**The breaker** (``partner``, from ``context.partner(partner_id)``): the
HTTP call runs through the partner's breaker and shared rate
(``eventbus.partners``), inside the guard, so a key already delivered is
skipped without asking the breaker, and a call the breaker refuses raises
``BreakerOpen`` before any request (the event is parked).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx
import requests

from eventbus import PermanentError, TransientError
from eventbus.guard import Guard
from eventbus.http import deadline
from eventbus.http.deadline_async import AsyncClient
from eventbus.http.retry_after import retry_after
from eventbus.partners import Partner

RETRYABLE_4XX = frozenset({408, 429})
MAX_HEADER_KEY = 200
HASHED_PREFIX = "sha256:"
# Raised for a URL that could never be sent (no redirect is followed, so it is ours): permanent.
# Not InvalidHeader: our headers are valid by construction (idempotency_header), so
# requests raises it for the answer's (conflicting Content-Length values): transient.
_UNSENDABLE = (requests.exceptions.InvalidURL, requests.exceptions.InvalidSchema,
               requests.exceptions.MissingSchema)
_UNSENDABLE_ASYNC = (httpx.InvalidURL, httpx.UnsupportedProtocol)


class PartnerUnavailable(TransientError):
    """Raised when a partner endpoint answered 408, 429, 5xx or could not be reached."""


class PartnerRejected(PermanentError):
    """Raised when a partner endpoint answered a 4xx other than 408 and 429."""


class BadPartnerId(PermanentError):
    """Raised when a partner id cannot be one segment of the partner URL's path."""


def idempotency_header(key: str) -> str:
    """Return the ``Idempotency-Key`` header value for an event key (rule in the docstring)."""
    plain = (0 < len(key) <= MAX_HEADER_KEY and key == key.strip()
             and all(" " <= char <= "~" for char in key) and not key.startswith(HASHED_PREFIX))
    if plain:
        return key
    return HASHED_PREFIX + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def partner_url(template: str, partner_id: str) -> str:
    """Fill ``template``'s ``{partnerId}`` with the percent-encoded ``partner_id``."""
    if partner_id in ("", ".", ".."):
        raise BadPartnerId(f"partnerId {partner_id!r} cannot be a URL path segment")
    try:
        segment = quote(partner_id, safe="")
    except UnicodeEncodeError:
        raise BadPartnerId("partnerId is not valid Unicode text (a lone surrogate)") from None
    return template.format(partnerId=segment)


@dataclasses.dataclass(frozen=True)
class Delivered:
    """The outcome of ``PartnerClient.deliver``: the partner took the call."""

    key: str
    status_code: int
    skipped: bool
    """True when an earlier call was already delivered and none was made now."""


def classify_status(status: int) -> str:
    """Return ``delivered``, ``transient`` or ``permanent`` for a partner's HTTP status."""
    if 200 <= status < 300:
        return "delivered"
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return "permanent"
    return "transient"


def _classification(exc: BaseException) -> str:
    return "permanent" if isinstance(exc, PermanentError) else "transient"


def delivered_status(status: int, url: str, later: str | None = None) -> int:
    """Return ``status`` if the partner took the call; raise its failure if not.

    A 429 or 503 with a ``Retry-After`` (``later``: seconds or an HTTP date) raises
    ``PartnerUnavailable`` from the ``RetryAfter`` it asks for, so the processor
    stores the event for that time (acked, the attempt spent) instead of a nack.
    """
    kind = classify_status(status)
    if kind != "delivered":
        error = f"partner answered {status} at {url}"
        asked = retry_after(status, later, error)
        if asked is not None:
            raise PartnerUnavailable(error) from asked
        raise (PartnerRejected if kind == "permanent" else PartnerUnavailable)(error)
    return status


class PartnerClient:
    """Makes guarded partner calls through the library's HTTP client."""

    def __init__(self, guard: Guard, *, timeout: float,
                 session: requests.Session | None = None, partner: Partner | None = None,
                 http: deadline.Client | None = None) -> None:
        """``timeout``: the call's total deadline; ``http``: the client (default one on
        ``session``, taken over or refused here: ``deadline.Client``); ``partner``: the
        breaker and rate the call goes through (None: none)."""
        self.guard, self.timeout = guard, timeout
        self.http = http if http is not None else deadline.Client(session)
        self.partner = partner

    def deliver(self, key: str, url: str | Callable[[], str],
                body: Mapping[str, Any]) -> Delivered:
        """POST ``body`` to ``url`` once per ``key``; raise on a failed or refused call.

        ``url`` may be a function: it is then called inside the guarded effect,
        so a URL that cannot be built fails the guard record like a failed call.
        """
        done = self.guard.run(key, lambda: self._through_partner(key, url, body),
                              classify=_classification)
        return Delivered(key, int(done.result.get("status_code", 0)), skipped=done.skipped)

    def _through_partner(self, key: str, url: str | Callable[[], str],
                         body: Mapping[str, Any]) -> dict[str, Any]:
        if self.partner is None:
            return self._effect(key, url, body)
        return self.partner.call(lambda: self._effect(key, url, body))

    def _effect(self, key: str, url: str | Callable[[], str],
                body: Mapping[str, Any]) -> dict[str, Any]:
        target = url() if callable(url) else url
        return {"status_code": self._call(key, target, body), "url": target}

    def _call(self, key: str, url: str, body: Mapping[str, Any]) -> int:
        status, later = self._post(url, {"Idempotency-Key": idempotency_header(key)}, body)
        return delivered_status(status, url, later)

    def _post(self, url: str, headers: dict[str, str],
              body: Mapping[str, Any]) -> tuple[int, str | None]:
        try:
            response = self.http.request("POST", url, total=self.timeout, json=dict(body),
                                         headers=headers, allow_redirects=False)
        except deadline.AnswerTooLarge as exc:
            return exc.status_code, None  # the status came whole; the notifier reads no body
        except _UNSENDABLE as exc:
            raise PartnerRejected(f"partner call to {url} cannot be sent: "
                                  f"{type(exc).__name__}: {exc}") from exc
        except requests.RequestException as exc:
            raise PartnerUnavailable(f"partner call to {url} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, response.headers.get("Retry-After")


class AsyncPartnerClient:
    """The partner call for async code: ``PartnerClient``'s request and rules, on httpx.

    ``call`` makes one call and classifies it exactly as ``PartnerClient``
    does (same header, same deadline rule, same cap, same statuses). It is the
    HTTP step only: the guard and the breaker around it come with the async
    forms of ``context.guard`` and ``context.partner``.
    """

    def __init__(self, http: AsyncClient, *, timeout: float) -> None:
        """``http``: the library's async client; ``timeout``: the call's total deadline."""
        self.http, self.timeout = http, timeout

    async def deliver(self, guard: Guard, key: str, url: str | Callable[[], str],
                      body: Mapping[str, Any], partner: Partner | None = None) -> Delivered:
        """``PartnerClient.deliver`` awaited: once per ``key`` (``guard.run_async``), through
        ``partner``'s breaker and rate (``call_async``); the URL built inside the guard."""
        async def effect() -> dict[str, Any]:
            target = url() if callable(url) else url
            return {"status_code": await self.call(key, target, body), "url": target}

        async def through_partner() -> dict[str, Any]:
            return await (partner.call_async(effect) if partner is not None else effect())

        done = await guard.run_async(key, through_partner, classify=_classification)
        return Delivered(key, int(done.result.get("status_code", 0)), skipped=done.skipped)

    async def call(self, key: str, url: str, body: Mapping[str, Any]) -> int:
        """POST ``body`` to ``url`` with ``key``'s header; the status, or raise its failure."""
        headers = {"Idempotency-Key": idempotency_header(key)}
        try:
            answer = await self.http.request("POST", url, total=self.timeout, json=dict(body),
                                             headers=headers)
        except deadline.AnswerTooLarge as exc:
            return delivered_status(exc.status_code, url)
        except _UNSENDABLE_ASYNC as exc:
            raise PartnerRejected(f"partner call to {url} cannot be sent: "
                                  f"{type(exc).__name__}: {exc}") from exc
        except (httpx.HTTPError, requests.RequestException) as exc:
            raise PartnerUnavailable(f"partner call to {url} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return delivered_status(answer.status_code, url, answer.headers.get("Retry-After"))
