"""Flask's test client's ``post``, over an ASGI app, so one test runs against both push entries.

``AsgiClient(asgi_app)`` sends each request through httpx's ``ASGITransport``
on an event loop of its own (one thread, like a server's), and answers with an
``AsgiResponse`` that reads as Flask's test response does (``status_code``,
``json``, ``get_json()``, ``get_data(as_text=)``, ``is_json``, ``headers``).
JSON bodies are encoded as Flask's test client encodes them (ASCII-escaped),
so a lone surrogate travels escaped on both entries.

The app's lifespan runs as a server runs it: its startup before the first
request, its shutdown at ``close()`` (``asgi_app``'s closes the processor and
the app's push threads), so nothing the app started outlives the client.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import threading
from collections.abc import Mapping
from typing import Any

import httpx


class AsgiResponse:
    """An httpx response read the way Flask's test response is."""

    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.headers = response.headers
        self.data = response.content
        self.is_json = response.headers.get("content-type", "").startswith("application/json")

    @property
    def json(self) -> Any:
        """The parsed JSON body (None when it is not JSON), as ``response.json`` in Flask."""
        return jsonlib.loads(self.data) if self.is_json else None

    def get_json(self) -> Any:
        """The parsed JSON body."""
        return self.json

    def get_data(self, as_text: bool = False) -> Any:
        """The body, as bytes or text."""
        return self.data.decode("utf-8", "replace") if as_text else self.data


class AsgiClient:
    """Posts to an ASGI app as ``app.test_client()`` posts to a Flask app."""

    def __init__(self, app: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://localhost")
        self._lifespan = Lifespan(app)
        asyncio.run_coroutine_threadsafe(self._lifespan.startup(), self._loop).result(60)

    def post(self, path: str, *, data: bytes | str | None = None, json: Any = None,
             headers: Mapping[str, str] | None = None,
             content_type: str | None = None) -> AsgiResponse:
        """POST like Flask's test client (``data``, ``json``, ``headers``, ``content_type``)."""
        sent = dict(headers or {})
        if json is not None:
            data, content_type = jsonlib.dumps(json), content_type or "application/json"
        if content_type is not None:
            sent["Content-Type"] = content_type
        content = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        return self.request("POST", path, content=content or b"", headers=sent)

    def request(self, method: str, path: str, **options: Any) -> AsgiResponse:
        """Any request, with httpx's options."""
        call = self._client.request(method, path, **options)
        return AsgiResponse(asyncio.run_coroutine_threadsafe(call, self._loop).result(60))

    def close(self) -> None:
        """Close the client, run the app's lifespan shutdown, and stop the loop."""
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self._lifespan.shutdown(), self._loop).result(60)
        # The loop's default executor ran the shutdown's blocking part: joined, not left.
        asyncio.run_coroutine_threadsafe(self._loop.shutdown_default_executor(),
                                         self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class Lifespan:
    """An ASGI app's lifespan, driven as a server drives it: ``startup()``, then ``shutdown()``."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._task: asyncio.Future[Any] | None = None
        self._receive: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def startup(self) -> None:
        """Start the lifespan; return when the app's startup is complete."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.ensure_future(self._app(scope, self._receive.get, self._sent.put))
        await self._receive.put({"type": "lifespan.startup"})
        await self._expect("lifespan.startup.complete")

    async def shutdown(self) -> None:
        """Shut the app down; return when its shutdown is complete and its lifespan returned."""
        task, self._task = self._task, None
        if task is None:
            return
        await self._receive.put({"type": "lifespan.shutdown"})
        await self._expect("lifespan.shutdown.complete")
        await task

    async def _expect(self, kind: str) -> None:
        message = await self._sent.get()
        if message.get("type") != kind:
            raise RuntimeError(f"the app's lifespan answered {message!r}, not {kind}")
