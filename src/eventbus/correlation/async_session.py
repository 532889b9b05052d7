"""An ``httpx.AsyncClient`` that writes one ``REQUEST_OUTBOUND`` line per call.

    client = logging_client()                    # an httpx.AsyncClient
    await client.post(url, json=body)            # one line, answered or not

The async twin of ``session.logging_session``: ``LoggingTransport`` wraps the
transport httpx sends through (httpx's public extension point, an
``AsyncBaseTransport``), so each HTTP exchange writes exactly one line, with
the status it got or the class of the error that ended it (a cancelled call,
cut at its deadline, included). A call without an ``X-Request-Id`` header gets
the current request's id.

Imports httpx: only the app's side uses it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from eventbus.correlation import tracecontext
from eventbus.correlation.outbound import outbound_call
from eventbus.correlation.session import KEY_HEADER, REQUEST_ID_HEADER


class LoggingTransport(httpx.AsyncBaseTransport):
    """Wraps an httpx transport; each request writes one outbound request line."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped transport, timed and logged once."""
        url = str(request.url)
        parts = urlsplit(url)
        request_id = tracecontext.current_request_id()
        if request_id and REQUEST_ID_HEADER not in request.headers:
            request.headers[REQUEST_ID_HEADER] = request_id
        with outbound_call(request.method, parts.netloc, parts.path or "/", target=url,
                           key=request.headers.get(KEY_HEADER, "")) as answer:
            response = await self.inner.handle_async_request(request)
            answer["status"] = response.status_code
        return response

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.inner.aclose()


def logging_client(transport: httpx.AsyncBaseTransport | None = None,
                   **kwargs: Any) -> httpx.AsyncClient:
    """Return a new ``httpx.AsyncClient`` (``kwargs`` are its own) whose calls are logged.

    ``transport`` (default httpx's ``AsyncHTTPTransport()``) is the one wrapped;
    TLS and pool settings are its own, as httpx ignores the client's for a
    transport it is given.
    """
    inner = transport if transport is not None else httpx.AsyncHTTPTransport()
    return httpx.AsyncClient(transport=LoggingTransport(inner), **kwargs)
