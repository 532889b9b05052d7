"""``eventbus.http.deadline_async`` against the same misbehaving local servers as the sync client.

Each hostile behaviour (``tests.hostile_server``) would hold a call 12 s or more;
the call has a 0.5 s deadline and must end well under 2 s with ``DeadlineExceeded``
(the sync client's error). Every test runs its coroutine with ``tests.aio.run``
(``asyncio.run`` in a thread of its own).
"""

from __future__ import annotations

import gzip
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
import requests
from hypothesis import HealthCheck, given, settings

from eventbus.correlation.async_session import LoggingTransport, logging_client
from eventbus.http.deadline import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    DeadlineExceeded,
    UnboundedSession,
)
from eventbus.http.deadline_async import Answer, AsyncClient
from tests import aio
from tests import hostile_server as hostile
from tests.hypothesis_profiles import examples
from tests.service.test_deadline import (
    BIG,
    BOUND,
    EVERY,
    HOSTILE,
    LENGTHS,
    OVERSIZE,
    TOTAL,
    hostile_length,
)
from tests.telemetry.support import captured_lines

T = TypeVar("T")
# httpx loads the CA bundle for each client it makes (0.1 s); the tests' clients share one.
TLS = ssl.create_default_context()


def run(call: Callable[[AsyncClient], Awaitable[T]], http: httpx.AsyncClient | None = None) -> T:
    """Run ``call`` on a fresh client (closed after) on a fresh event loop."""
    async def main() -> T:
        client = AsyncClient(http if http is not None else httpx.AsyncClient(verify=TLS))
        try:
            return await call(client)
        finally:
            await client.aclose()
    return aio.run(main())


def get(url: str, **kwargs: Any) -> Callable[[AsyncClient], Awaitable[Answer]]:
    return lambda client: client.request("GET", url, total=TOTAL, **kwargs)


def assert_cut_at_the_deadline(url: str, http: httpx.AsyncClient | None = None) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"within 0\.5 s"):
        run(get(url), http)
    took = time.monotonic() - started
    assert took < BOUND, f"the call took {took:.1f} s"


@pytest.mark.parametrize("behaviour", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_ends_within_the_deadline(behaviour: hostile.Behaviour) -> None:
    with hostile.HostileServer(behaviour) as server:
        assert_cut_at_the_deadline(server.url + "/x")


@pytest.mark.parametrize("behaviour", OVERSIZE.values(), ids=OVERSIZE.keys())
def test_a_body_over_the_cap_raises_at_once(behaviour: hostile.Behaviour) -> None:
    with hostile.HostileServer(behaviour) as server:
        started = time.monotonic()
        with pytest.raises(AnswerTooLarge, match="1048576-byte cap") as raised:
            run(lambda client: client.request("GET", server.url + "/x", total=5.0))
        took = time.monotonic() - started
    assert raised.value.status_code == 200 and took < BOUND
    assert len(BIG) > MAX_ANSWER_BYTES


def test_a_default_client_makes_its_own_httpx_client() -> None:
    assert isinstance(AsyncClient().http, httpx.AsyncClient)


def test_a_normal_answer_is_returned_whole() -> None:
    with hostile.HostileServer(hostile.answer(200, gzip.compress(b'{"ok": true}'),
                                              extra="Content-Encoding: gzip\r\n")) as server:
        url = server.url + "/a"
        answer = run(get(url))
    assert (answer.status_code, answer.json(), answer.url) == (200, {"ok": True}, url)


def test_a_redirect_is_answered_as_it_is_and_following_one_is_refused() -> None:
    with hostile.HostileServer(hostile.redirect("/elsewhere")) as server:
        answer = run(get(server.url + "/r"))
        with pytest.raises(ValueError, match="follows no redirect"):
            run(get(server.url + "/r", follow_redirects=True))
        with pytest.raises(ValueError, match="deadline is total="):
            run(get(server.url + "/r", timeout=60.0))
    assert answer.status_code == 302 and len(server.requests) == 1


def test_a_refused_connection_is_not_a_deadline() -> None:
    with hostile.HostileServer(hostile.answer(200, b"")) as server:
        url = server.url
    with pytest.raises(httpx.ConnectError):
        run(get(url + "/x"))


@pytest.mark.parametrize("http", [httpx.Client(), requests.Session(), object()],
                         ids=["httpx.Client", "requests.Session", "object"])
def test_anything_but_an_httpx_async_client_is_refused_when_built(http: Any) -> None:
    with pytest.raises(UnboundedSession, match=r"needs an httpx\.AsyncClient"):
        AsyncClient(http)


def test_an_apps_client_with_hooks_and_a_logging_transport_is_still_bounded() -> None:
    hooked: list[str] = []

    async def on_response(response: httpx.Response) -> None:
        hooked.append(str(response.status_code))
        await response.aread()  # an app's hook that reads the body itself

    with hostile.HostileServer(hostile.trickle_body(EVERY)) as server, \
            captured_lines() as lines:
        url = server.url + "/x"
        assert_cut_at_the_deadline(url, logging_client(
            httpx.AsyncHTTPTransport(verify=TLS), event_hooks={"response": [on_response]},
            timeout=60.0, follow_redirects=True))
    assert hooked == ["200"]  # the hook ran, and its read was cut with the call
    [line] = [line for line in lines if line.get("logType") == "REQUEST_OUTBOUND"]
    assert (line["status"], line["target"]) == (200, url)


def test_the_logging_transport_logs_a_failed_call_once() -> None:
    with hostile.HostileServer(hostile.answer(200, b"")) as server:
        url = server.url + "/x"
    with captured_lines() as lines, pytest.raises(httpx.ConnectError):
        run(get(url), httpx.AsyncClient(
            transport=LoggingTransport(httpx.AsyncHTTPTransport(verify=TLS))))
    [line] = [line for line in lines if line.get("logType") == "REQUEST_OUTBOUND"]
    assert (line["error"], line["target"]) == ("ConnectError", url)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=LENGTHS)
def test_any_content_length_is_an_answer_or_an_http_error_never_a_bare_exception(
        value: bytes) -> None:
    with hostile.HostileServer(hostile_length(value)) as server:
        try:
            answer = run(lambda client: client.request("GET", server.url + "/x", total=2.0))
        except (httpx.HTTPError, requests.RequestException):
            return  # h11 refuses a malformed length: a RemoteProtocolError, like any bad answer
    assert answer.status_code == 200 and len(answer.content) <= 2
