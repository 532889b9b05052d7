"""Partner HTTP calls, made at most once per event key through the library's guard.

A partner endpoint is a side effect the event store cannot make idempotent,
so each call runs inside ``context.guard`` (seed 004's "Idempotence For Side
Effects": key check, lease, call, key set), with the key in an
``Idempotency-Key`` header so a partner that deduplicates can do so too.

The partner's answer is classified and recorded on the guard record:

* 2xx → the key is set for good (SUCCESS with ``status_code``);
* 408, 429, 5xx, other non-4xx answers, network errors and timeouts →
  ``PartnerUnavailable`` (transient): the event is retried;
* any other 4xx → ``PartnerRejected`` (permanent): stored FAILED for good.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import requests

from eventbus import PermanentError, TransientError
from eventbus.guard import Guard

RETRYABLE_4XX = frozenset({408, 429})


class PartnerUnavailable(TransientError):
    """Raised when a partner endpoint answered 408, 429, 5xx or could not be reached."""


class PartnerRejected(PermanentError):
    """Raised when a partner endpoint answered a 4xx other than 408 and 429."""


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


class PartnerClient:
    """Makes guarded partner calls; the HTTP session is injected for tests."""

    def __init__(self, guard: Guard, *, timeout: float,
                 session: requests.Session | None = None) -> None:
        self.guard, self.timeout, self.session = guard, timeout, session

    def deliver(self, key: str, url: str, body: Mapping[str, Any]) -> Delivered:
        """POST ``body`` to ``url`` once per ``key``; raise on a failed or refused call."""
        done = self.guard.run(key, lambda: {"status_code": self._call(key, url, body),
                                            "url": url},
                              classify=_classification)
        return Delivered(key, int(done.result.get("status_code", 0)), skipped=done.skipped)

    def _call(self, key: str, url: str, body: Mapping[str, Any]) -> int:
        try:
            post = self.session.post if self.session is not None else requests.post
            response = post(url, json=dict(body), timeout=self.timeout,
                            headers={"Idempotency-Key": key}, allow_redirects=False)
        except requests.RequestException as exc:
            raise PartnerUnavailable(f"partner call to {url} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        kind = classify_status(response.status_code)
        if kind != "delivered":
            error = f"partner answered {response.status_code} at {url}"
            raise (PartnerRejected if kind == "permanent" else PartnerUnavailable)(error)
        return response.status_code
