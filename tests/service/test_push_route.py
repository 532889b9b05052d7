"""``PushRoute``: a push skips Flask's dispatch only where Flask would add nothing to it.

The same request gets the same status, body, headers and request line
whether ``PushRoute`` answers it or Flask does (forced here by a no-op
``before_request`` hook, one of the things that make it step aside); hostile
bodies, headers and hosts included, and an app's own sessions and response class
(issue 39 fault 6). The header cases a client cannot send (CR or LF in a value)
are sent raw to a real server in ``test_push_route_raw.py``.
"""

from __future__ import annotations

import base64
import io
import json
import string
from typing import Any

import flask
import pytest
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface, SessionInterface
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventbus.correlation import logs
from eventbus.model.router import Router
from tests.hypothesis_profiles import examples
from tests.service.conftest import Harness, Make, event, wrapped

PINNED = {"X-Request-Id": "req-1",
          "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
"""A request id and a trace given by the caller, so both answers and lines carry the same."""
VARYING = ("timestamp", "duration", "httpRequest")
"""Request-line fields that differ between two requests whatever served them."""


def delivery(payload: dict[str, Any] | bytes, message_id: str = "m-1",
             **attributes: str) -> bytes:
    return json.dumps(wrapped(payload, message_id, **attributes)).encode()


def noop_router() -> Router:
    """A router whose ``TEST`` handler does nothing: the pushes here are processed."""
    routes = Router()
    routes.handler("TEST")(lambda context: None)
    return routes


def through_flask(app: flask.Flask) -> None:
    """Give ``app`` a request hook that changes nothing: pushes then go through Flask."""
    app.before_request(lambda: None)


def capture_logs() -> io.StringIO:
    """Send the service's lines to a buffer (after ``create_app``, which sets them up too)."""
    stream = io.StringIO()
    logs.configure("svc", stream=stream)
    return stream


def request_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [{k: v for k, v in line.items() if k not in VARYING}
            for line in lines if line.get("logType") == "REQUEST_INBOUND"]


def answer(h: Harness, body: bytes, **environ: str) -> tuple[str, dict[str, str], bytes]:
    """The status line (code and reason), the headers and the body of a push."""
    response = h.client.post("/", data=body, content_type="application/json", headers=PINNED,
                             environ_overrides=environ)
    headers = {name: value for name, value in response.headers.items()}
    return response.status, headers, response.get_data()


def pair(make_harness: Make, **overrides: Any) -> tuple[Harness, Harness]:
    """Two apps alike on stores of their own; the second answers through Flask."""
    overrides.setdefault("router", noop_router())
    fast, slow = make_harness(**overrides), make_harness(**overrides)
    through_flask(slow.app)
    return fast, slow


BODIES = {
    "processed": delivery(event(), idempotency_key="k-1"),
    "not a delivery": b'{"a": 1}',
    "not JSON": b"\xff\xfe not json",
    "too large": b"x" * 3000,
    "unknown type": delivery(event("NOPE"), idempotency_key="k-2"),
    "bad base64": b'{"message": {"data": "%%%", "messageId": "m"}, "subscription": "s"}',
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_both_routes_give_the_same_answer_and_request_line(make_harness: Make,
                                                           name: str) -> None:
    fast, slow = pair(make_harness, max_body_bytes=2000)
    log_stream = capture_logs()
    first = answer(fast, BODIES[name])
    fast_lines = request_lines(log_stream)
    second = answer(slow, BODIES[name])
    slow_lines = request_lines(log_stream)[len(fast_lines):]
    assert first == second
    assert first[0].split(" ", 1)[1].isupper()  # werkzeug's reason: "400 BAD REQUEST"
    if name == "processed":
        assert json.loads(first[2])["outcome"] == "processed"
    assert first[1]["Content-Type"] == "application/json"
    assert first[1]["X-Request-Id"] == "req-1"
    assert int(first[1]["Content-Length"]) == len(first[2])
    assert len(fast_lines) == len(slow_lines) == 1 and fast_lines == slow_lines


def test_a_duplicate_is_answered_alike(make_harness: Make) -> None:
    fast, slow = pair(make_harness)
    body = delivery(event(), idempotency_key="dup-1")
    answers = [answer(h, body) for h in (fast, fast, slow, slow)]
    assert answers[0] == answers[2] and answers[1] == answers[3]
    assert json.loads(answers[0][2])["outcome"] == "processed"
    assert json.loads(answers[1][2])["outcome"] == "duplicate"


@pytest.mark.parametrize("declared", ["\u00b2", "9" * 5000, "-5", "1e9", " 12", "0"],
                         ids=["superscript two", "5000 digits", "negative", "float", "space",
                              "zero"])
def test_a_hostile_content_length_gets_the_same_answer(make_harness: Make,
                                                       declared: str) -> None:
    fast, slow = pair(make_harness, router=Router(), max_body_bytes=1000)
    body = delivery(event(), idempotency_key="cl-1")
    first = answer(fast, body, CONTENT_LENGTH=declared)
    assert first == answer(slow, body, CONTENT_LENGTH=declared)
    assert first[0].startswith("4"), first


HOSTILE_TEXT = st.text(st.characters(codec="utf-16", exclude_categories=()), max_size=40)
HEADER_TEXT = st.text(st.characters(codec="utf-16", exclude_categories=(),
                                    exclude_characters="\r\n"), max_size=40)
"""Hostile header text a client can send: anything but CR and LF, which end a header line
(werkzeug's test client refuses them; ``test_push_route_raw.py`` sends them raw)."""
HOSTILE_BODY = st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
                 | HOSTILE_TEXT,
                 lambda inner: st.lists(inner, max_size=4)
                 | st.dictionaries(HOSTILE_TEXT, inner, max_size=4), max_leaves=12)
    .map(lambda value: json.dumps({"message": {"data": base64.b64encode(
        json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")).decode(),
        "messageId": "h", "attributes": {"event_type": "TEST"}}, "subscription": "s"})
        .encode("utf-8", "surrogatepass")),
)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=HOSTILE_BODY, request_id=HEADER_TEXT)
def test_hostile_pushes_get_the_same_answer_on_both_routes(make_harness: Make, body: bytes,
                                                           request_id: str) -> None:
    fast, slow = pair(make_harness)
    answers = []
    for h in (fast, slow):
        response = h.client.post("/", data=body, content_type="application/json",
                                 headers={"X-Request-Id": request_id.encode(
                                     "utf-8", "surrogatepass").decode("latin-1")})
        parsed = response.get_json()
        parsed.pop("requestId", None)  # a generated one when the given id is unusable
        answers.append((response.status_code, parsed))
    assert answers[0] == answers[1]
    assert answers[0][0] < 500 or answers[0][1].get("outcome") in ("retry", "unavailable")


def test_a_request_hook_still_sees_every_push(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    seen: list[str] = []

    def hook() -> None:
        seen.append(flask.request.path)

    h.app.before_request(hook)
    response = h.client.post("/push", data=delivery(event(), idempotency_key="hook-1"),
                             content_type="application/json")
    assert response.status_code == 200 and seen == ["/push"]


def test_a_request_signal_receiver_still_sees_every_push(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    seen: list[str] = []

    def started(sender: flask.Flask, **extra: Any) -> None:
        seen.append(flask.request.path)

    flask.request_started.connect(started, h.app)
    try:
        response = h.client.post("/", data=delivery(event(), idempotency_key="sig-1"),
                                 content_type="application/json")
    finally:
        flask.request_started.disconnect(started, h.app)
    assert response.status_code == 200 and seen == ["/"]


def test_flasks_max_content_length_still_applies(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    h.app.config["MAX_CONTENT_LENGTH"] = 100
    response = h.client.post("/", data=delivery(event(), idempotency_key="max-1"),
                             content_type="application/json")
    assert response.status_code == 413 and h.store.summaries() == []


def test_flasks_trusted_hosts_still_apply(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    h.app.config["TRUSTED_HOSTS"] = ["events.example.com"]
    response = h.client.post("/", data=delivery(event(), idempotency_key="host-1"),
                             content_type="application/json")
    assert response.status_code == 400 and h.store.summaries() == []


def test_a_wrapped_push_view_still_runs(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    view = h.app.view_functions["push/"]

    def guarded() -> Any:
        if flask.request.headers.get("Authorization") != "Bearer ok":
            return {"error": "unauthorized"}, 401
        return view()

    h.app.view_functions["push/"] = guarded
    body = delivery(event(), idempotency_key="view-1")
    assert h.client.post("/", data=body, content_type="application/json").status_code == 401
    allowed = h.client.post("/", data=body, content_type="application/json",
                            headers={"Authorization": "Bearer ok"})
    assert allowed.status_code == 200 and allowed.json["outcome"] == "processed"


def test_an_apps_own_request_class_still_applies(make_harness: Make) -> None:
    class Small(flask.Request):
        max_content_length = 10

    h = make_harness(router=noop_router())
    h.app.request_class = Small
    response = h.client.post("/", data=delivery(event(), idempotency_key="class-1"),
                             content_type="application/json")
    assert response.status_code == 413 and h.store.summaries() == []


def test_other_methods_and_paths_are_flasks(make_harness: Make) -> None:
    h = make_harness(router=Router())
    assert h.client.get("/").status_code == 405
    assert h.client.put("/push", data=b"{}").status_code == 405
    missing = h.client.post("/push/", data=b"{}")
    assert missing.status_code == 404 and missing.json["error"] == "not_found"


def test_a_bug_outside_the_answer_is_a_logged_503_never_a_500(
        make_harness: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness(router=noop_router())
    log_stream = capture_logs()
    service = h.app.extensions["eventbus"]

    def broken(environ: dict[str, Any]) -> Any:
        raise RuntimeError("a bug of our own")

    monkeypatch.setattr(service, "answer_environ", broken)
    response = h.client.post("/", data=delivery(event(), idempotency_key="bug-1"),
                             content_type="application/json")
    assert response.status_code == 503 and response.json["error"] == "internal"
    assert response.headers["X-Request-Id"] == response.json["requestId"] != ""
    assert "Traceback" not in response.get_data(as_text=True)
    assert "a bug of our own" in log_stream.getvalue()


def flask_views(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each push Flask's view (``PushService.handle``) answers."""
    service = h.app.extensions["eventbus"]
    seen: list[str] = []
    handle = service.handle

    def recording(request: flask.Request) -> flask.Response:
        seen.append(request.path)
        return handle(request)

    monkeypatch.setattr(service, "handle", recording)
    return seen


def test_a_push_skips_flasks_dispatch_unless_the_app_adds_something(
        make_harness: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness(router=noop_router())
    seen = flask_views(h, monkeypatch)
    body = delivery(event(), idempotency_key="skip-1")
    assert h.client.post("/", data=body, content_type="application/json").status_code == 200
    assert seen == []
    through_flask(h.app)
    assert h.client.post("/", data=body, content_type="application/json").status_code == 200
    assert seen == ["/"]


def test_a_mounted_console_keeps_pushes_off_flasks_dispatch(
        make_harness: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventbus.web.console import ConsoleConfig, mount_console

    h = make_harness(router=noop_router())
    mount_console(h.app, ConsoleConfig(token="local-token-123"))
    seen = flask_views(h, monkeypatch)
    body = delivery(event(), idempotency_key="console-1")
    response = h.client.post("/push", data=body, content_type="application/json")
    assert response.status_code == 200 and response.json["outcome"] == "processed"
    assert seen == []  # the console's hooks are its blueprint's: they never run for a push
    assert h.client.get("/console/").status_code == 401  # and still run for its pages


LABEL = st.text(string.ascii_letters + string.digits + "-_", max_size=70)
HOSTILE_HOST = st.one_of(
    st.lists(LABEL, min_size=1, max_size=4).map(".".join),  # DNS labels: long, empty, odd
    st.builds("{}:{}".format, st.lists(LABEL, min_size=1, max_size=3).map(".".join),
              st.integers(min_value=0, max_value=99999)),
    # What a WSGI server makes of any header bytes: latin-1 text, never CR or LF.
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=80),
)
REFUSED_HOSTS = {"64-character label": "a" * 64 + ".example.com", "empty label": "a..b",
                 "leading dot": ".example.com", "300 characters": "x" * 300}
"""Hosts Flask's URL adapter refuses (werkzeug's ``BadHost``): Flask's path answers 400."""


def host_answers(make_harness: Make, host: str) -> list[tuple[Any, ...]]:
    """Each route's answer and request lines to one processable push from ``host``."""
    fast, slow = pair(make_harness)
    log_stream = capture_logs()
    answers: list[tuple[Any, ...]] = []
    for h in (fast, slow):
        before = len(request_lines(log_stream))
        reply = answer(h, delivery(event(), idempotency_key="host-k"), HTTP_HOST=host)
        answers.append((*reply, request_lines(log_stream)[before:]))
    return answers


@pytest.mark.parametrize("host", sorted(REFUSED_HOSTS.values()), ids=sorted(REFUSED_HOSTS))
def test_a_host_flask_refuses_gets_flasks_400_on_both_routes(make_harness: Make,
                                                             host: str) -> None:
    fast_answer, slow_answer = host_answers(make_harness, host)
    assert fast_answer == slow_answer
    assert fast_answer[0] == "400 BAD REQUEST"
    assert json.loads(fast_answer[2])["error"] == "bad_request"


def test_a_refused_host_is_never_processed(make_harness: Make) -> None:
    h = make_harness(router=noop_router())
    for _ in range(2):  # the second time too: a refusal is not remembered as a pass
        status, _headers, _body = answer(h, delivery(event(), idempotency_key="bad-host"),
                                         HTTP_HOST="a..b")
        assert status == "400 BAD REQUEST"
    assert h.store.summaries() == []
    good, _headers, body = answer(h, delivery(event(), idempotency_key="bad-host"),
                                  HTTP_HOST="events.example.com")
    assert good == "200 OK" and json.loads(body)["outcome"] == "processed"


def test_flask_judges_each_host_once(make_harness: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness(router=noop_router())
    judged: list[str] = []
    create = h.app.create_url_adapter

    def recording(request: flask.Request | None) -> Any:
        judged.append(request.environ["HTTP_HOST"] if request is not None else "")
        return create(request)

    monkeypatch.setattr(h.app, "create_url_adapter", recording)
    for number, host in enumerate(["a.example.com", "a.example.com", "b.example.com"]):
        body = delivery(event(), idempotency_key=f"once-{number}")
        assert answer(h, body, HTTP_HOST=host)[0] == "200 OK"
    assert judged == ["a.example.com", "b.example.com"]


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=HOSTILE_HOST)
@example(host=REFUSED_HOSTS["64-character label"])
@example(host=REFUSED_HOSTS["empty label"])
@example(host="a" * 63 + ".example.com")  # the longest label Flask accepts
def test_hostile_hosts_get_the_same_answer_on_both_routes(make_harness: Make,
                                                          host: str) -> None:
    fast_answer, slow_answer = host_answers(make_harness, host)
    assert fast_answer == slow_answer


class RecordingSessions(SessionInterface):
    """An app's own session interface: it notes each request it opens and stamps each answer."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def open_session(self, app: flask.Flask, request: flask.Request) -> SecureCookieSession:
        """Note the request's path; an empty session."""
        self.opened.append(request.path)
        return SecureCookieSession()

    def save_session(self, app: flask.Flask, session: Any, response: flask.Response) -> None:
        """Stamp the answer, as a server-side session store's cookie would."""
        response.headers["X-Session"] = "saved"


def test_an_apps_own_session_interface_runs_for_every_push(make_harness: Make) -> None:
    fast, slow = pair(make_harness)
    sessions = [RecordingSessions(), RecordingSessions()]
    fast.app.session_interface, slow.app.session_interface = sessions
    first = answer(fast, delivery(event(), idempotency_key="session-1"))
    assert first == answer(slow, delivery(event(), idempotency_key="session-1"))
    assert first[1]["X-Session"] == "saved" and json.loads(first[2])["outcome"] == "processed"
    assert sessions[0].opened == sessions[1].opened == ["/"]


def test_a_session_cookie_is_refreshed_alike_on_both_routes(make_harness: Make) -> None:
    fast, slow = pair(make_harness)
    for h in (fast, slow):
        h.app.secret_key = "push-route-test-secret"
        interface = h.app.session_interface
        assert isinstance(interface, SecureCookieSessionInterface)
        signer = interface.get_signing_serializer(h.app)
        assert signer is not None
        # A permanent session: Flask's default interface sends its cookie again each request.
        h.client.set_cookie("session", signer.dumps({"_permanent": True, "user": "u"}))
    answers = [answer(h, delivery(event(), idempotency_key="cookie-1")) for h in (fast, slow)]
    assert "Set-Cookie" in answers[0][1] and "Set-Cookie" in answers[1][1]
    assert answers[0][0] == answers[1][0] and answers[0][2] == answers[1][2]


def test_an_apps_own_response_class_still_applies(make_harness: Make) -> None:
    class Tagged(flask.Response):
        def get_wsgi_headers(self, environ: Any) -> Any:
            headers = super().get_wsgi_headers(environ)
            headers["X-Tagged"] = "yes"
            return headers

    h = make_harness(router=noop_router())
    h.app.response_class = Tagged
    status, headers, _body = answer(h, delivery(event(), idempotency_key="response-1"))
    assert status == "200 OK" and headers["X-Tagged"] == "yes"
