"""A partner's ``Retry-After`` header, read: when a 429 or a 503 says to come back.

``parse("120")`` is 120 seconds, ``parse("Wed, 21 Oct 2026 07:28:00 GMT")`` that
moment (RFC 9110 section 10.2.3 allows both); anything else (empty, garbage, a
negative number, a date that does not parse) is None, never an error.
``retry_after(status, header, reason)`` is the ``RetryAfter`` a handler raises
for such an answer (``eventbus.model.errors.RetryAfter``, which bounds any value),
or None when the answer is not a 429 or 503 with a readable header; a 429's is
``partner_wide`` (the partner's own limit: its breaker pauses every call until then).
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

from eventbus.model.errors import RetryAfter

ASKS_LATER = frozenset({429, 503})
"""The statuses whose ``Retry-After`` says when to come back."""


def parse(header: str | None) -> float | datetime | None:
    """Seconds (a non-negative integer) or an HTTP date, as the header gives it; else None."""
    text = (header or "").strip()
    if text.isascii() and text.isdigit():
        return float(int(text[:12]))  # a 12-digit wait is already far past any bound
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def retry_after(status: int, header: str | None, reason: str) -> RetryAfter | None:
    """The ``RetryAfter`` of a 429 or 503 answer with a readable ``Retry-After``; else None."""
    if status not in ASKS_LATER:
        return None
    when = parse(header)
    # A 429 is the partner's own limit, for every caller: its breaker pauses them all.
    return None if when is None else RetryAfter(when, reason, partner_wide=status == 429)
