"""The ASGI push entry: the same service as the Flask app, for uvicorn or an async stack.

    uvicorn main:asgi_app --host 0.0.0.0 --port 8080        # main.py: asgi_app = asgi_app(app)

``asgi_app(flask_app)`` serves the ``PushService`` that ``create_app`` built
(``app.extensions["eventbus"]``) on Starlette: ``POST /`` and ``/push``,
``GET /health``, ``/ready`` and (when the app has one) ``/metrics``, with the
same answers, headers and request lines as gunicorn's ``main:app``; an unknown
path or method gets Flask's JSON error (``{"error": "not_found", ...}``).

**What runs where.** The body is read on the server's event loop, so a client
that trickles its body holds no thread (under gunicorn it holds one of the
worker's). The push itself (``PushService.answer``: auth, parse, claim, the
handlers, finish) runs on one of ``Settings.async_concurrency`` threads of
this app; its ``async def`` handlers await on the processor's own loop
(``eventbus.processor.handler_loop``), never on the server's, so a handler's
async clients live on one loop whatever entry delivered the event.

**Lifespan.** On SIGTERM the processor stops first (``eventbus.web.signals``):
async handlers still awaiting after ``async_stop_grace_seconds`` are
cancelled, so their requests answer 503 and close. At shutdown (uvicorn's
lifespan end, after the requests in flight) the processor is closed: what
still awaits after ``async_stop_grace_seconds`` is cancelled, its event given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import io
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import flask
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from werkzeug.exceptions import default_exceptions
from werkzeug.wsgi import get_content_length

from eventbus.web.app import PUSH_PATHS
from eventbus.web.service import PushService, read_body
from eventbus.web.signals import stop_first

__all__ = ["asgi_app", "wsgi_environ"]



def asgi_app(app: flask.Flask) -> Starlette:
    """Return the ASGI app serving ``app``'s push service (see the module docstring)."""
    service: PushService = app.extensions["eventbus"]
    pool = ThreadPoolExecutor(service.settings.async_concurrency,
                              thread_name_prefix="eventbus-asgi")

    async def push(request: Request) -> Response:
        environ = wsgi_environ(request.scope)
        body = await _body(request, environ, service.settings.max_body_bytes)
        # The body rule of every entry, over what ``_body`` read.
        read = functools.partial(read_body, get_content_length(environ), io.BytesIO(body))
        answer = await _in_thread(pool, service.answer, environ, read)
        content, status, headers = answer
        return Response(content, status, headers, media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        ok = await _in_thread(pool, service.ensure_indexes)
        return JSONResponse({"status": "ok" if ok else "store unavailable"},
                            200 if ok else 503)

    async def metrics(request: Request) -> Response:
        page, content_type = service.telemetry.metrics_page() or (b"", "text/plain")
        return Response(page, headers={"content-type": content_type})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # uvicorn's SIGTERM handler is in place by now; the processor stops first, so a
        # handler that still awaits gives its event back and its connection closes.
        stop_first(service.processor.stop)
        yield
        # After the requests in flight: cancel what still awaits past the grace, give it back.
        await asyncio.get_running_loop().run_in_executor(None, service.processor.close)
        pool.shutdown(wait=False)

    routes = [Route(path, push, methods=["POST"]) for path in PUSH_PATHS]
    routes += [Route("/health", health, methods=["GET"]),
               Route("/ready", ready, methods=["GET"])]
    if service.telemetry.metrics_page() is not None:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: _http_error})


def wsgi_environ(scope: Mapping[str, Any]) -> dict[str, Any]:
    """The WSGI environ gunicorn would build for ``scope`` (what ``PushService`` reads).

    Paths are WSGI's latin-1 text of the raw bytes; header names with an
    underscore are dropped, as gunicorn drops them (one could pose as another
    header); repeated headers are joined with commas.
    """
    client, server = scope.get("client") or ("", 0), scope.get("server") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": _latin1(scope.get("root_path", "")),
        "PATH_INFO": _latin1(scope["path"]),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "SERVER_NAME": str(server[0]), "SERVER_PORT": str(server[1]),
        "REMOTE_ADDR": str(client[0]),
        "wsgi.url_scheme": scope.get("scheme", "http"),
    }
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        if "_" in name:
            continue
        key = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}.get(
            name, "HTTP_" + name.upper().replace("-", "_"))
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


async def _body(request: Request, environ: dict[str, Any], limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the body; none when its declared length is over ``limit``
    (the service answers 413 after its auth check, as it does for WSGI)."""
    declared = get_content_length(environ)
    if declared is not None and declared > limit:
        return b""
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[:limit + 1]


async def _in_thread(pool: ThreadPoolExecutor, function: Callable[..., Any], *args: Any) -> Any:
    # The context goes along (a request's trace scope is a context variable).
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(context.run, function, *args))


def _latin1(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


async def _http_error(request: Request, error: Exception) -> Response:
    """Flask's JSON answer (``create_app``'s ``_http_error``) for an unknown path or method."""
    assert isinstance(error, HTTPException)
    known = default_exceptions.get(error.status_code)
    flasks = known() if known is not None else None  # werkzeug's own names and texts
    name = (flasks.name if flasks is not None else "error").lower().replace(" ", "_")
    message = (flasks.description if flasks is not None else None) or str(error.detail or "")
    headers = dict(error.headers or {})
    return JSONResponse({"error": name, "message": message or ""}, error.status_code, headers)
