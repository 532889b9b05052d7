"""The push endpoint, independent of which app serves it.

``PushService.answer(environ, read_body)`` is one push from a WSGI-style
environ (its headers, path and peer) and a body reader to its JSON answer,
status and headers, logged. ``handle`` is that for a ``flask.Request``: the
gunicorn app (``create_app``) and the functions-framework target
(``push_target``) call it; the ASGI entry (``eventbus.web.asgi``) calls
``answer`` with the environ of its ASGI scope and the body it read. So all of
them answer and log alike.

``PushRoute`` is the push routes straight on WSGI, in front of the Flask app
(``create_app`` installs it as ``app.wsgi_app``): a POST on ``/`` or
``/push`` goes to ``answer_environ`` without Flask's dispatch, unless the app
has anything of its own to run around a request (see its docstring).
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import time
import uuid
from collections.abc import Callable, Mapping
from typing import IO, Any

import flask
from flask.sessions import SecureCookieSessionInterface
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wsgi import get_content_length, get_input_stream

from eventbus.correlation import logs, tracecontext
from eventbus.correlation.outbound import http_request
from eventbus.model.errors import PayloadTooLarge, RequestError, StoreUnavailable
from eventbus.model.outcome import FACTS
from eventbus.processor import Processor, Result
from eventbus.pubsub.envelope import parse_delivery
from eventbus.pubsub.push_auth import Authenticator
from eventbus.settings import Settings
from eventbus.store.base import EventStore
from eventbus.telemetry import Telemetry
from eventbus.web import http_status as status_table

logger = logging.getLogger("eventbus")
# The answer's encoder, made once: ``json.dumps`` with options builds a new one per call.
_ANSWER = json.JSONEncoder(separators=(",", ":"), default=str)


class PushService:
    """Authenticates, parses, processes and logs one push request."""

    def __init__(self, settings: Settings, store: EventStore, processor: Processor,
                 authenticator: Authenticator | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.settings, self.store, self.processor = settings, store, processor
        self.authenticator = authenticator
        self.telemetry = telemetry or Telemetry()
        # Only tracing reads a request's context through OpenTelemetry's propagators.
        self._extract = self.telemetry.extract if self.telemetry.tracing else None
        self._indexed = False

    def view(self) -> flask.Response:
        """The Flask view of the push routes: ``handle`` of the current request."""
        return self.handle(flask.request)

    def handle(self, request: flask.Request) -> flask.Response:
        """Answer one push request; 2xx acks, anything else makes Pub/Sub retry."""
        # A partial, no frame of its own: a push's walk.
        read = functools.partial(read_body, request.content_length, request.stream)
        body, status, headers = self.answer(request.environ, read)
        return flask.Response(body, status, headers, mimetype="application/json")

    def answer_environ(self, environ: dict[str, Any]) -> tuple[bytes, int, dict[str, str]]:
        """``answer`` for a WSGI environ alone: its body read as Flask's ``request.stream``
        reads it (bounded by its Content-Length; none without one, unless terminated)."""
        read = functools.partial(read_body, get_content_length(environ),
                                 get_input_stream(environ))
        return self.answer(environ, read)

    def answer(self, environ: dict[str, Any],
               read_body: Callable[[int], bytes]) -> tuple[bytes, int, dict[str, str]]:
        """Answer one push: its JSON body, status and headers; the request line logged.

        ``environ`` is WSGI's (or built like it from an ASGI scope);
        ``read_body(limit)`` returns at most ``limit + 1`` bytes of the body, or
        raises ``PayloadTooLarge``. It runs in a telemetry scope: every line
        logged meanwhile carries the request id and the trace (the push's,
        then the message's once known).
        """
        # The headers are read once, from the WSGI environ: werkzeug's
        # ``request.headers`` looks each name up anew, a visible share of a push.
        headers = _headers(environ)
        request_id = _request_id(headers)
        trace = ((self._extract and self._extract(headers))
                 or tracecontext.from_headers(headers) or tracecontext.new_trace())
        with tracecontext.scope(trace, request_id):
            started = time.perf_counter()
            result: Result | None = None
            try:
                result = self._process(read_body, headers, request_id)
                body, status = status_table.outcome_response(result, request_id)
            except RequestError as exc:
                body, status = status_table.error_response(exc, request_id)
            except Exception:  # our own bug: log it, nack it, never show a traceback
                logger.exception("unexpected error", extra={"requestId": request_id})
                body, status = status_table.internal_error_response(request_id)
            _log(environ, request_id, status, started, result)
        # One small JSON object per push: encoded here rather than through
        # Flask's JSON provider, which costs more than the body is worth.
        return (_ANSWER.encode(body).encode(), status,
                {"X-Request-Id": request_id})

    def ensure_indexes(self) -> bool:
        """Create the collection's indexes once; False while the store is unreachable."""
        if not self._indexed:
            try:
                self.processor.ensure_indexes()
                self._indexed = True
            except StoreUnavailable as exc:
                logger.warning("indexes not ensured yet: %s", exc)
        return self._indexed

    def _process(self, read_body: Callable[[int], bytes], headers: dict[str, str],
                 request_id: str) -> Result:
        if self.authenticator is not None:
            self.authenticator.verify(headers.get("authorization", ""))
        body = read_body(self.settings.max_body_bytes)
        delivery = parse_delivery(body, headers)
        self.ensure_indexes()
        return self.processor.process(delivery, request_id)


class PushRoute:
    """WSGI middleware: a push straight to ``PushService``, everything else to Flask.

    Flask's dispatch around a push (request and app contexts, URL matching,
    the response object, signals) costs about a tenth of the CPU a push
    spends in the service (bench/handler.py); the service needs none of it,
    since it reads the WSGI environ itself. Hand-written because Flask has no
    lighter route; it is the middleware Flask documents
    (``app.wsgi_app = Middleware(app.wsgi_app)``), so a user's own middleware
    still wraps it.

    It steps aside, and the request goes through Flask as before, whenever
    Flask would do more for it: another method or path, an app-wide request
    hook (``before_request``, ``after_request``, teardown, URL processors; a
    blueprint's, such as the mounted console's, never runs for a push), a
    receiver of Flask's request or app-context signals, ``MAX_CONTENT_LENGTH``
    or ``TRUSTED_HOSTS``, its own ``request_class`` or ``response_class``, its
    own ``session_interface`` (any but Flask's default, which Flask opens and
    saves around every request), a cookie sent to an app with a
    ``secret_key`` (the default interface could then refresh a session
    cookie), a push view replaced or wrapped, or a host Flask's URL adapter
    refuses (a 64-character DNS label, an empty label: Flask answers 400).
    So what an application adds to Flask (Sentry, OpenTelemetry's Flask
    instrumentation, its own hooks, sessions or auth) still sees pushes. The
    status line, body, headers and request line are the same either way; a
    bug of our own that escapes ``answer`` is a logged 503 (a nack) here.

    The host is judged by Flask's own code, not a copy of its rules:
    ``Flask.create_url_adapter`` on a request of the environ, exactly as
    Flask's request context calls it, so the verdict follows Flask and
    werkzeug (their IDNA rules, ``SERVER_NAME``) wherever they go. That call
    costs about a tenth of a push, so each host it accepted is remembered
    (keyed by every environ value and setting it reads that can change its
    verdict; at most ``_HOSTS_KEPT``), and a push from a known host pays one
    set lookup. A refused host is never remembered: Flask answers each one.
    """

    def __init__(self, app: flask.Flask, service: PushService, endpoints: Mapping[str, str],
                 flask_wsgi: Callable[..., Any]) -> None:
        """``endpoints``: each push path and the endpoint ``create_app`` registered it as."""
        self.app, self.service, self.endpoints = app, service, endpoints
        self.flask_wsgi = flask_wsgi
        # Hosts (``_host_key``) Flask's URL adapter accepted. Set operations are atomic
        # under the GIL, so gunicorn's threads share it; a race only costs a second check.
        self._hosts: set[tuple[Any, ...]] = set()

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Any:
        """Answer a push here when Flask would add nothing to it; otherwise Flask's answer."""
        app, endpoint = self.app, self.endpoints.get(environ.get("PATH_INFO", ""))
        # One expression, no helper: every push asks (test_walk_budget).
        if (environ.get("REQUEST_METHOD") != "POST" or endpoint is None
                # The app's own hooks (key None); a blueprint's (the console's) run only
                # for its routes, never for a push.
                or app.before_request_funcs.get(None) or app.after_request_funcs.get(None)
                or app.teardown_request_funcs.get(None)
                or app.url_value_preprocessors.get(None) or app.teardown_appcontext_funcs
                or app.config.get("MAX_CONTENT_LENGTH") is not None
                or app.config.get("TRUSTED_HOSTS") is not None
                or app.request_class is not flask.Request
                or app.response_class is not flask.Response
                # Flask opens and saves the app's session around every request; its
                # default one does nothing there unless the request has a cookie to read.
                or type(app.session_interface) is not SecureCookieSessionInterface
                or (app.secret_key and "HTTP_COOKIE" in environ)
                # The app replaced or wrapped the push view (its own auth, say).
                or app.view_functions.get(endpoint) != self.service.view
                or any(map(_RECEIVERS, _FLASK_SIGNALS))):
            return self.flask_wsgi(environ, start_response)
        # Written out, not a helper: every push asks (test_walk_budget); only a new host calls.
        host = (environ.get("HTTP_HOST"), environ.get("SERVER_NAME"), environ.get("SERVER_PORT"),
                environ.get("wsgi.url_scheme"), app.config.get("SERVER_NAME"))
        if host not in self._hosts and not self._flask_takes_host(environ, host):
            return self.flask_wsgi(environ, start_response)  # its 400, as without PushRoute
        try:
            body, status, headers = self.service.answer_environ(environ)
        except Exception:  # ``answer`` holds every push's errors; this would be our own bug
            request_id = uuid.uuid4().hex
            logger.exception("unexpected error answering a push", extra={"requestId": request_id})
            error, status = status_table.internal_error_response(request_id)
            body, headers = _ANSWER.encode(error).encode(), {"X-Request-Id": request_id}
        # werkzeug's status line, reason in capitals ("400 BAD REQUEST"), as Flask sends it.
        start_response(f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}",
                       [("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))), *headers.items()])
        return [body]

    def _flask_takes_host(self, environ: dict[str, Any], host: tuple[Any, ...]) -> bool:
        """Whether Flask's URL adapter accepts this request's host; remembered if so.

        ``Flask.create_url_adapter`` is what Flask's request context calls on every
        request, and a refusal there (werkzeug's ``BadHost``) is the 400 it answers.
        ``host`` holds what that verdict depends on (the path and method are a push's;
        a WSGI server's strings always decode), so it keys the memory.
        """
        try:
            self.app.create_url_adapter(flask.Request(environ))
        except Exception:  # whatever Flask's own path meets here, Flask answers
            return False
        if len(self._hosts) >= _HOSTS_KEPT:  # many hosts (a scan): start again, stay small
            self._hosts.clear()
        self._hosts.add(host)
        return True


_HOSTS_KEPT = 64
"""How many accepted hosts ``PushRoute`` remembers: a service has one or a few."""

# Flask's signals sent around a request's dispatch: a receiver of any of them needs Flask's.
_FLASK_SIGNALS = (flask.request_started, flask.request_finished, flask.request_tearing_down,
                  flask.got_request_exception, flask.appcontext_pushed,
                  flask.appcontext_popped, flask.appcontext_tearing_down)
_RECEIVERS = operator.attrgetter("receivers")  # blinker's public map of a signal's receivers


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    # The request's headers, lowercased, in one pass over the WSGI environ.
    found = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
             if name.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        found["content-type"] = environ["CONTENT_TYPE"]
    return found


def read_body(declared: int | None, stream: IO[bytes], limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``, or ``PayloadTooLarge`` when the body declared
    (``declared``, werkzeug's reading of Content-Length) or read is longer: every entry's
    body rule (WSGI's, Flask's view's and the ASGI app's)."""
    # werkzeug parses Content-Length (a hostile one, e.g. "²" or 5,000 digits, is None).
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds {limit}")
    body = stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"body exceeds {limit} bytes")
    return body


def _request_id(headers: dict[str, str]) -> str:
    given = headers.get("x-request-id", "")
    trace = headers.get("x-cloud-trace-context", "").split("/")[0]
    candidate = given or trace
    usable = candidate.isascii() and candidate.isprintable()  # it goes back in a header
    return candidate[:128] if usable and candidate else uuid.uuid4().hex


def _log(environ: dict[str, Any], request_id: str, status: int, started: float,
         result: Result | None) -> None:
    # Read from the WSGI environ: werkzeug's ``request.url`` and ``host``
    # rebuild and re-decode the URL on each access, a large share of a push.
    seconds = time.perf_counter() - started
    agent, method = environ.get("HTTP_USER_AGENT", ""), environ.get("REQUEST_METHOD", "")
    host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
    path, root = _wsgi_text(environ, "PATH_INFO") or "/", _wsgi_text(environ, "SCRIPT_NAME")
    query = environ.get("QUERY_STRING", "")
    remote = environ.get("REMOTE_ADDR", "")
    url = (f"{environ.get('wsgi.url_scheme', 'http')}://{host}{root}{path}"
           f"{'?' + query if query else ''}")
    fields: dict[str, Any] = {
        "host": host, "sourceIp": remote, "sourceHost": agent, "method": method,
        "path": path, "status": status, "requestId": request_id,
        "duration": round(seconds * 1000, 2),
        "httpRequest": http_request(method, url, status, seconds, remote_ip=remote,
                                    user_agent=agent,
                                    extra={"requestSize": environ.get("CONTENT_LENGTH") or "0",
                                           "protocol": environ.get("SERVER_PROTOCOL", "")}),
    }
    level = None
    if result is not None:
        fields.update(outcome=result.outcome.value, idempotency_key=result.key,
                      event_type=result.event_type, attempt=result.attempt)
        facts = FACTS[result.outcome]  # a lookup, not the property: a push's walk budget
        # The outcome's level when its own status was answered.
        level = facts.level if status == facts.status else None
    logs.request_line(fields, level)


def _wsgi_text(environ: dict[str, Any], name: str) -> str:
    # WSGI carries paths as latin-1 strings of the raw bytes; werkzeug shows them as UTF-8.
    return str(environ.get(name, "")).encode("latin-1", "replace").decode("utf-8", "replace")
