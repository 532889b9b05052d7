"""Outbound HTTP calls for async code: the same total deadline and answer cap, on httpx.

``eventbus.http.deadline`` bounds a ``requests`` call by shutting its sockets down
from a timer. Here the call is a coroutine, so the deadline is simply the
event loop's: ``asyncio.timeout(total)`` cancels whatever the call awaits
(the pool, connect, TLS, send, the head, every read of the body), so a
partner that sends its headers and trickles its body is cut at the deadline
on a kept-alive connection and a closing one alike. httpx's own timeouts
bound each socket operation only (a byte every 2 s never trips a 3 s read
timeout); they are set to the whole deadline as well.

Rules, the same as the sync client's:

* the call ends within ``total`` seconds, answer read whole, or raises
  ``DeadlineExceeded`` (``eventbus.http.deadline``'s: a ``requests.Timeout``, so one
  ``except`` clause serves both clients);
* the answer's body (decoded) is capped at ``max_bytes``: past it the call
  raises ``AnswerTooLarge`` with the status, which came whole. The bytes are
  counted as they come: a declared ``Content-Length`` is httpx's (h11 refuses
  a hostile one as a ``RemoteProtocolError``, like any bad answer);
* redirects are not followed (the partner call follows none): a redirect is
  answered as it is, its body capped like any other;
* the client is the library's: ``AsyncClient`` takes an app's
  ``httpx.AsyncClient`` (its event hooks, headers and transport, a logging
  one included, all run inside the deadline) and refuses anything else with
  ``UnboundedSession`` when it is built. Any transport httpx awaits is cut
  at the deadline; one that blocks the event loop itself (synchronous I/O
  in a coroutine) cannot be, by any deadline.

The answer is an ``Answer`` (status, headers, the body read), not an
``httpx.Response``: a response built again from decoded bytes would decode
them a second time. Imports httpx, and ``eventbus.http.deadline`` for its errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx

from eventbus.http.deadline import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    DeadlineExceeded,
    UnboundedSession,
)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A whole answer, read within its call's deadline and cap."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    url: str

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.content)


class AsyncClient:
    """An httpx client the library owns: every call ends within its deadline, its answer capped.

    ``http`` (default a new ``httpx.AsyncClient()``) must be an
    ``httpx.AsyncClient``; it is used on one event loop, as httpx's pools are.
    """

    def __init__(self, http: httpx.AsyncClient | None = None, *,
                 max_bytes: int = MAX_ANSWER_BYTES) -> None:
        if http is not None and not isinstance(http, httpx.AsyncClient):
            raise UnboundedSession(
                f"an async partner call needs an httpx.AsyncClient, not a "
                f"{type(http).__module__}.{type(http).__qualname__}: only a coroutine the "
                "event loop can cancel ends at its deadline")
        self.http = http if http is not None else httpx.AsyncClient()
        self.max_bytes = max_bytes

    async def request(self, method: str, url: str, *, total: float, **kwargs: Any) -> Answer:
        """Build the request (``httpx.AsyncClient.build_request``'s arguments) and ``send`` it.

        A request that cannot be built raises what httpx raises for it
        (``httpx.InvalidURL``, say) before anything is sent.
        """
        if kwargs.pop("follow_redirects", False):
            raise ValueError("AsyncClient follows no redirect: a redirect is answered as it is")
        if "timeout" in kwargs:
            raise ValueError("the call's deadline is total=; httpx's timeouts are set from it")
        request = self.http.build_request(method, url, timeout=httpx.Timeout(total), **kwargs)
        return await self.send(request, total=total)

    async def send(self, request: httpx.Request, *, total: float) -> Answer:
        """Send ``request`` and read its answer whole, within ``total`` seconds and the cap."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(total):
                response = await self.http.send(request, stream=True, follow_redirects=False)
                try:
                    content = await self._read(response)
                finally:
                    await response.aclose()
        except TimeoutError as exc:  # asyncio.timeout's: the deadline passed
            raise _exceeded(request, total, loop.time() - started) from exc
        except httpx.TimeoutException as exc:  # one operation's, set to the whole deadline
            if loop.time() - started >= total:
                raise _exceeded(request, total, loop.time() - started) from exc
            raise
        return Answer(response.status_code, response.headers, content, str(request.url))

    async def _read(self, response: httpx.Response) -> bytes:
        chunks, seen = [], 0
        async for chunk in response.aiter_bytes():
            seen += len(chunk)
            if seen > self.max_bytes:
                raise AnswerTooLarge(
                    f"the {response.status_code} answer from {response.request.url} sent more "
                    f"than its {self.max_bytes}-byte cap", status_code=response.status_code)
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        """Close the httpx client's pooled connections."""
        await self.http.aclose()


def _exceeded(request: httpx.Request, total: float, spent: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"{request.method} {request.url}: no complete answer within "
                            f"{total:g} s (gave up after {spent:.1f} s)")
