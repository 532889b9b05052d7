"""A ``requests`` session that writes one ``REQUEST_OUTBOUND`` line per call.

    session = logging_session()                  # or logging_session(existing)
    session.post(url, json=body, timeout=5)      # one line, answered or not

Every adapter of the session is wrapped, so each HTTP exchange (a redirect
followed is a second one) writes exactly one line: with the status it got,
or with the class of the error that ended it (connection refused, timeout).
A call without an ``X-Request-Id`` header gets the current request's id, so
the partner's logs can be matched to ours (seed 004).

Imports ``requests``: only the app's side (the ``[service]`` extra) uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter

from eventbus.correlation import tracecontext
from eventbus.correlation.outbound import outbound_call

REQUEST_ID_HEADER = "X-Request-Id"
KEY_HEADER = "Idempotency-Key"


class LoggingAdapter(BaseAdapter):
    """Wraps a transport adapter; each ``send`` writes one outbound request line."""

    def __init__(self, inner: BaseAdapter) -> None:
        super().__init__()
        self.inner = inner

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Mapping[str, str] | None = None) -> requests.Response:
        """Send ``request`` through the wrapped adapter, timed and logged once."""
        url = request.url or ""
        parts = urlsplit(url)
        request_id = tracecontext.current_request_id()
        if request_id and REQUEST_ID_HEADER not in request.headers:
            request.headers[REQUEST_ID_HEADER] = request_id
        with outbound_call(request.method or "GET", parts.netloc, parts.path or "/",
                           target=url, key=str(request.headers.get(KEY_HEADER, ""))) as answer:
            response = self.inner.send(request, stream=stream, timeout=timeout, verify=verify,
                                       cert=cert, proxies=proxies)
            answer["status"] = response.status_code
        return response

    def close(self) -> None:
        """Close the wrapped adapter."""
        self.inner.close()


def logging_session(session: requests.Session | None = None) -> requests.Session:
    """Return ``session`` (default a new one) with every adapter logging its calls.

    Wrapping twice is harmless: an adapter already wrapped is left as it is.
    """
    session = session if session is not None else requests.Session()
    for prefix, adapter in list(session.adapters.items()):
        if not isinstance(adapter, LoggingAdapter):
            session.mount(prefix, LoggingAdapter(adapter))
    return session
