"""``eventbus.http.deadline`` against real local servers that misbehave on purpose.

Each hostile behaviour (``tests.hostile_server``) would hold a call for 12 s
or more (60 bytes, one every 0.2 s); the call has a 0.5 s deadline and must end
well under 2 s, with ``DeadlineExceeded``. The bound is generous on purpose:
it separates "ended at the deadline" from "held by the server", not 0.5 s from
0.6 s. A body over the cap raises ``AnswerTooLarge`` at once, and a normal
answer is returned whole.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.http import deadline
from eventbus.http.deadline import AnswerTooLarge, DeadlineExceeded
from tests import hostile_server as hostile
from tests.hypothesis_profiles import examples
from tests.telemetry.support import captured_lines

TOTAL = 0.5
BOUND = 2.0  # the attacks below would take 12 s or more
EVERY = 0.2


@pytest.fixture()
def http() -> Iterator[requests.Session]:
    with deadline.session() as made:
        yield made


def get(http: requests.Session, url: str, **kwargs: Any) -> requests.Response:
    return deadline.request(http, "GET", url, total=TOTAL, **kwargs)


def assert_held_at_most_the_deadline(http: requests.Session, url: str) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"within 0\.5 s"):
        get(http, url)
    took = time.monotonic() - started
    assert took < BOUND, f"the call took {took:.1f} s"


HOSTILE = {
    "slow headers": hostile.trickle_head(EVERY),
    "trickled body, keep-alive": hostile.trickle_body(EVERY),
    "trickled body, HTTP/1.0": hostile.trickle_body(EVERY, version="HTTP/1.0"),
    "trickled body, Connection: close": hostile.trickle_body(EVERY, close=True),
    "trickled body, closed, no length": hostile.trickle_body(EVERY, close=True, length=False),
    "trickled body, HTTP/1.0, no length": hostile.trickle_body(EVERY, version="HTTP/1.0",
                                                               length=False),
}


@pytest.mark.parametrize("behaviour", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_ends_within_the_deadline(http: requests.Session,
                                                   behaviour: hostile.Behaviour) -> None:
    # Before the answer was watched, the closing variants held a 0.5 s call 12 s:
    # urllib3 hands the socket to the answer and clears connection.sock.
    with hostile.HostileServer(behaviour) as server:
        assert_held_at_most_the_deadline(http, server.url + "/x")


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
def test_the_deadline_covers_a_redirect_to_a_trickling_answer(http: requests.Session,
                                                              version: str) -> None:
    with hostile.HostileServer(hostile.trickle_body(EVERY, version=version)) as target, \
            hostile.HostileServer(hostile.redirect(target.url + "/x")) as hop:
        assert_held_at_most_the_deadline(http, hop.url + "/r")


def test_the_deadline_covers_the_whole_redirect_chain(http: requests.Session) -> None:
    # Each hop is well within the deadline; thirty of them (requests' limit) are not.
    with hostile.HostileServer(hostile.redirect("/again", after=0.2)) as loop:
        assert_held_at_most_the_deadline(http, loop.url + "/again")
    assert len(loop.requests) <= 4


def test_a_call_through_an_http_proxy_is_watched_too(http: requests.Session) -> None:
    with hostile.HostileServer(hostile.trickle_body(EVERY, version="HTTP/1.0")) as proxy:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            get(http, "http://partner.invalid/x", proxies={"http": proxy.url})
        took = time.monotonic() - started
    assert took < BOUND and proxy.requests[0].startswith(b"GET http://partner.invalid/x ")


BIG = b"x" * (8 * deadline.MAX_ANSWER_BYTES)
OVERSIZE = {
    "declared": hostile.answer(200, BIG),
    "chunked": hostile.answer(200, BIG, framing="chunked"),
    "closed": hostile.answer(200, BIG, framing="close"),
    "gzip bomb": hostile.answer(200, gzip.compress(BIG), extra="Content-Encoding: gzip\r\n"),
}


@pytest.mark.parametrize("behaviour", OVERSIZE.values(), ids=OVERSIZE.keys())
def test_a_body_over_the_cap_raises_at_once(http: requests.Session,
                                            behaviour: hostile.Behaviour) -> None:
    with hostile.HostileServer(behaviour) as server:
        started = time.monotonic()
        with pytest.raises(AnswerTooLarge, match="1048576-byte cap") as raised:
            deadline.request(http, "GET", server.url + "/x", total=5.0)
        took = time.monotonic() - started
    assert raised.value.status_code == 200 and took < BOUND


def test_a_redirect_body_over_the_cap_raises(http: requests.Session) -> None:
    with hostile.HostileServer(hostile.answer(302, BIG, framing="chunked",
                                              extra="Location: /next\r\n")) as server, \
            pytest.raises(AnswerTooLarge) as raised:
        get(http, server.url + "/x")
    assert raised.value.status_code == 302


def test_a_normal_answer_is_returned_whole_and_the_connection_reused(
        http: requests.Session) -> None:
    with hostile.HostileServer(hostile.answer(200, b'{"ok": true}')) as server:
        first = get(http, server.url + "/a")
        time.sleep(TOTAL + 0.2)  # the first call's deadline passes: its timer must not cut
        second = get(http, server.url + "/b")
    assert (first.status_code, first.json(), second.json()) == (200, {"ok": True}, {"ok": True})
    assert len(server.requests) == 2


def test_a_refused_connection_is_not_a_deadline(http: requests.Session) -> None:
    with hostile.HostileServer(hostile.answer(200, b"")) as server:
        url = server.url
    with pytest.raises(requests.ConnectionError) as raised:
        get(http, url + "/x")
    assert not isinstance(raised.value, DeadlineExceeded)


def test_calls_on_one_session_from_many_threads_keep_their_own_deadlines(
        http: requests.Session) -> None:
    # One call's timer shuts down its own sockets only, never a pooled one another call uses.
    outcomes: list[str] = []
    with hostile.HostileServer(hostile.answer(200, b"ok")) as fast, \
            hostile.HostileServer(hostile.trickle_body(EVERY, close=True)) as slow:
        def call(url: str) -> None:
            try:
                outcomes.append(get(http, url).text)
            except DeadlineExceeded:
                outcomes.append("deadline")
        threads = [threading.Thread(target=call, args=(server.url + "/x",))
                   for server in (slow, fast, slow, fast, fast)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=BOUND * 2)
    assert sorted(outcomes) == ["deadline", "deadline", "ok", "ok", "ok"]


# One server for every example: each sets what it answers.
FRAMINGS = st.sampled_from(["length", "chunked", "close"])


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(0, 6000), cap=st.integers(0, 4000), framing=FRAMINGS,
       status=st.sampled_from([200, 204, 302, 404, 503]))
def test_an_answer_is_returned_whole_up_to_the_cap_and_refused_past_it(
        size: int, cap: int, framing: str, status: int) -> None:
    body = bytes(i % 251 for i in range(size)) if status != 204 else b""
    with hostile.HostileServer(hostile.answer(status, body, framing=framing)) as server, \
            deadline.session() as http:
        call = lambda: deadline.request(http, "GET", server.url + "/x",  # noqa: E731
                                        total=5.0, max_bytes=cap, allow_redirects=False)
        if len(body) > cap:
            with pytest.raises(AnswerTooLarge) as raised:
                call()
            assert raised.value.status_code == status
        else:
            answer = call()
            assert (answer.status_code, answer.content) == (status, body)


# -- whatever the session: adopted or refused (issue 32) -----------------------------------

@pytest.fixture()
def trickling() -> Iterator[str]:
    """The URL of a partner that trickles its body over HTTP/1.0."""
    with hostile.HostileServer(hostile.trickle_body(EVERY, version="HTTP/1.0")) as server:
        yield server.url + "/x"


def test_a_plain_session_is_bounded_too(trickling: str) -> None:
    # The trap: deadline.request trusted any session and gave a plain one per-read
    # timeouts only, so a trickled body held the call far past its deadline.
    with requests.Session() as plain:
        assert_held_at_most_the_deadline(plain, trickling)


def test_a_session_with_its_own_adapters_and_hooks_is_still_bounded(trickling: str) -> None:
    from eventbus.correlation.session import LoggingAdapter, logging_session

    hooked: list[int] = []

    def read_in_a_hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        hooked.append(len(response.content))  # an app's hook that reads the body itself

    session = requests.Session()
    session.mount("http://127.0.0.1", requests.adapters.HTTPAdapter(max_retries=2,
                                                                     pool_maxsize=3))
    session.hooks["response"].append(read_in_a_hook)
    client = deadline.Client(logging_session(session))
    for prefix, adapter in client.session.adapters.items():
        assert isinstance(adapter, LoggingAdapter), prefix  # the app's wrappers stay
        assert isinstance(adapter.inner, deadline.DeadlineAdapter), prefix
    mine = client.session.get_adapter("http://127.0.0.1/x")
    assert isinstance(mine, LoggingAdapter) and isinstance(mine.inner, deadline.DeadlineAdapter)
    assert (mine.inner.max_retries.total, mine.inner.poolmanager.connection_pool_kw["maxsize"]) \
        == (2, 3)  # its retries and pool size carried over
    with captured_lines() as lines:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.request("GET", trickling, total=TOTAL)
        took = time.monotonic() - started
    assert took < BOUND and hooked == []  # the hook's read was cut with the call
    [line] = [line for line in lines if line.get("logType") == "REQUEST_OUTBOUND"]
    assert line["target"] == trickling  # the app's logging wrapper still wrote its line


class Transport(requests.adapters.BaseAdapter):
    """A transport of the app's own (a mock, a unix socket...): nothing can cut it."""

    def send(self, *args: Any, **kwargs: Any) -> requests.Response:
        raise AssertionError("never called: refused when the client is built")

    def close(self) -> None:
        """Nothing to close."""


class Retrying(requests.adapters.HTTPAdapter):
    """An HTTPAdapter subclass: what it overrides is unknown, so it is not trusted."""


@pytest.mark.parametrize("adapter", [Transport(), Retrying()], ids=["transport", "subclass"])
def test_a_session_that_cannot_honour_the_deadline_is_refused_when_the_client_is_built(
        adapter: requests.adapters.BaseAdapter) -> None:
    from eventbus.correlation.session import logging_session

    session = requests.Session()
    session.mount("https://partner.example/", adapter)
    for wrapped in (session, logging_session(session)):
        with pytest.raises(deadline.UnboundedSession,
                           match=r"'https://partner\.example/'.*DeadlineAdapter"):
            deadline.Client(wrapped)


def test_a_wrapper_that_sends_elsewhere_than_it_says_is_refused_at_the_call() -> None:
    class Liar(requests.adapters.BaseAdapter):
        def __init__(self) -> None:
            super().__init__()
            self.inner = deadline.DeadlineAdapter()
            self.other = requests.adapters.HTTPAdapter()

        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
            return self.other.send(request, **kwargs)

        def close(self) -> None:
            self.other.close()

    session = requests.Session()
    session.mount("http://", Liar())
    with hostile.HostileServer(hostile.answer(200, b"ok")) as server, \
            pytest.raises(deadline.UnboundedSession, match="did not come through"):
        deadline.Client(session).request("GET", server.url + "/x", total=TOTAL)


# A Content-Length no parser should trust: "²" and 5,000 digits passed str.isdigit() and
# then raised a bare ValueError from int(); "5, 6" is two lengths.
HOSTILE_LENGTHS = [b"\xb2", b"\xb2\xb3\xb9", b"9" * 5000, b"1" * 4301, b"-5", b"1e9", b" 12",
                   b"5, 6", b"+5", b"1_0", b"0x10", b"", b"99999999999999999999"]
LENGTHS = st.sampled_from(HOSTILE_LENGTHS) | st.binary(max_size=40).filter(
    lambda value: b"\r" not in value and b"\n" not in value)


def hostile_length(value: bytes, status: int = 200) -> hostile.Behaviour:
    """A whole answer whose Content-Length is ``value``, delimited by closing."""
    return hostile.raw(b"HTTP/1.1 %d X\r\nContent-Length: %s\r\nConnection: close\r\n\r\nok"
                       % (status, value))


@pytest.mark.parametrize("value", HOSTILE_LENGTHS[:4], ids=["sup2", "sup", "5000", "4301"])
def test_a_hostile_content_length_is_no_length_and_the_answer_is_read_under_the_cap(
        http: requests.Session, value: bytes) -> None:
    with hostile.HostileServer(hostile_length(value)) as server:
        answer = get(http, server.url + "/x")
    assert (answer.status_code, answer.content) == (200, b"ok")


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=LENGTHS)
def test_any_content_length_is_an_answer_or_a_requests_error_never_a_bare_exception(
        value: bytes) -> None:
    with hostile.HostileServer(hostile_length(value)) as server, deadline.session() as http:
        try:
            answer = deadline.request(http, "GET", server.url + "/x", total=2.0, max_bytes=100)
        except requests.RequestException:
            return  # classified: a too large, cut or malformed answer is a requests error
    assert answer.status_code == 200 and len(answer.content) <= 2
