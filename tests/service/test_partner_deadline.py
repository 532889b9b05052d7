"""The partner call's deadline and cap hold however the app is wired (issue 32).

The app's router is built as ``main.py`` builds it (``create_router(AppSettings
.from_env(...))``: a plain ``requests.Session`` wrapped for logging), and its
partner is a real local socket server (``tests.hostile_server``) that sends its
headers at once and then one body byte every 2 s (60 bytes: two minutes). The
call's deadline is 3 s, longer than the gap between two bytes, so only a
deadline on the whole call ends it; before the library owned its client, the
sync call was held until the last byte. The async client (for async handlers)
is held to the same rule. A hostile ``Content-Length`` is a classified
answer, never a bare exception counted against the partner's breaker.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from hypothesis import HealthCheck, given, settings

from eventbus.guard import Guard
from eventbus.http.deadline import UnboundedSession
from eventbus.http.deadline_async import AsyncClient
from eventbus.model.event import EntityMetadata, Event
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock
from handlers import create_router
from handlers.notifications import NOTIFY, PartnerNotifier
from handlers.partners import AsyncPartnerClient, PartnerClient, PartnerUnavailable
from handlers.settings import AppSettings
from tests import aio
from tests import hostile_server as hostile
from tests.hypothesis_profiles import examples
from tests.partner_stores import beside
from tests.service.conftest import START, Make
from tests.service.test_cascade import on_the_bus, order
from tests.service.test_deadline import HOSTILE_LENGTHS, LENGTHS, hostile_length
from tests.service.test_deadline_async import TLS

DEADLINE = 3.0
EVERY = 2.0  # one body byte every 2 s: a per-read timeout of 3 s never fires
BOUND = DEADLINE + 1.5
TRICKLES = {"HTTP/1.0": {"version": "HTTP/1.0"}, "keep-alive": {}}


@pytest.fixture(params=TRICKLES.values(), ids=TRICKLES.keys())
def trickling(request: pytest.FixtureRequest) -> Iterator[str]:
    """The partner URL template of a server that trickles its answer's body."""
    with hostile.HostileServer(hostile.trickle_body(EVERY, **request.param)) as server:
        yield server.url + "/partners/{partnerId}/events"


def app_settings(template: str) -> AppSettings:
    """The app's settings as ``main.py`` reads them, from the environment."""
    return AppSettings.from_env({"EVENTBUS_PARTNER_URL": template,
                                 "EVENTBUS_PARTNER_TIMEOUT_SECONDS": str(DEADLINE)})


def notifier(router: Any) -> PartnerNotifier:
    """The router's ``PARTNER_NOTIFY`` step."""
    meta = EntityMetadata(partner_id="p1", entity_id="e-1", entity_type="Order")
    step = router.route_for(Event(NOTIFY, "v1", "OUT", meta, {})).handler
    assert isinstance(step, PartnerNotifier)
    return step


def test_a_trickled_answer_ends_within_its_deadline_through_the_apps_router(
        make_harness: Make, trickling: str) -> None:
    publisher, clock = CapturingPublisher(), FakeClock(START)
    relays: list[Relay] = []
    h = make_harness(router=create_router(app_settings(trickling)), clock=clock,
                     publisher=publisher, after_success=lambda key, out: relays[0](key, out))
    relays.append(Relay(h.store, publisher, now=clock, budget=2.0,
                        sleep=lambda seconds: None, jitter=lambda: 0.5))
    assert h.push(order()).status_code == 200
    [message] = on_the_bus(publisher.take())  # PARTNER_NOTIFY, as the relay published it
    started = time.monotonic()
    answered = h.push(message.data, "m-notify", **message.attributes)
    took = time.monotonic() - started
    assert took < BOUND, f"the partner call held the push {took:.1f} s"
    assert answered.status_code == 503  # transient: the event is retried
    guard = h.store.guard_get(message.attributes["idempotency_key"]) or {}
    assert guard["status"] == "FAILED" and "DeadlineExceeded" in guard["error"]["message"]


def test_a_trickled_answer_ends_within_its_deadline_through_the_async_client(
        trickling: str) -> None:
    step = notifier(create_router(app_settings(trickling)))
    url = trickling.format(partnerId="p1")
    started = time.monotonic()
    with pytest.raises(PartnerUnavailable, match=r"DeadlineExceeded.*within 3 s"):
        aio.run(step.async_client().call("k-1", url, {"n": 1}))
    took = time.monotonic() - started
    assert took < BOUND, f"the async partner call took {took:.1f} s"


class Transport(requests.adapters.BaseAdapter):
    """An app's own transport: nothing can end its calls at a deadline."""

    def send(self, *args: Any, **kwargs: Any) -> requests.Response:
        raise AssertionError("never called: refused at start-up")

    def close(self) -> None:
        """Nothing to close."""


def test_a_session_or_client_that_cannot_be_bounded_is_refused_at_start_up() -> None:
    settings = app_settings("http://127.0.0.1:9/partners/{partnerId}/events")
    session = requests.Session()
    session.mount("https://", Transport())
    with pytest.raises(UnboundedSession, match="'https://'"):
        create_router(settings, session)
    with pytest.raises(UnboundedSession, match=r"httpx\.AsyncClient"):
        create_router(settings, async_http=httpx.Client())  # type: ignore[arg-type]
    assert create_router(settings, requests.Session(), httpx.AsyncClient()) is not None


@pytest.mark.parametrize("value", HOSTILE_LENGTHS[:4], ids=["sup2", "sup", "5000", "4301"])
def test_a_200_with_a_hostile_content_length_is_delivered_and_never_counts_against_the_breaker(
        value: bytes) -> None:
    # It raised a bare ValueError in the call, which the breaker counted as a failure.
    clock = FakeClock(START)
    store = MemoryEventStore(clock=clock)
    partner = Partners.beside(store, Settings(breaker_failures=1), now=clock).get("acme")
    client = PartnerClient(Guard(store, lease=dt.timedelta(seconds=30), now=clock),
                           timeout=DEADLINE, partner=partner)
    with hostile.HostileServer(hostile_length(value)) as server:
        delivered = client.deliver("k-1", server.url + "/x", {"n": 1})
    assert (delivered.status_code, delivered.skipped) == (200, False)
    assert beside(store).breaker_get("acme") is None  # no failure stored: the breaker never moved


def async_partner() -> AsyncPartnerClient:
    """The notifier's async client, on an httpx client of its own (one per event loop)."""
    return AsyncPartnerClient(AsyncClient(httpx.AsyncClient(verify=TLS)), timeout=2.0)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=LENGTHS)
def test_any_content_length_is_delivered_or_unavailable_sync_and_async(value: bytes) -> None:
    clock = FakeClock(START)
    store = MemoryEventStore(clock=clock)
    sync = PartnerClient(Guard(store, lease=dt.timedelta(seconds=30), now=clock), timeout=2.0)
    with hostile.HostileServer(hostile_length(value)) as server:
        url = server.url + "/x"
        outcomes = []
        for call in (lambda: sync.deliver("k", url, {}).status_code,
                     lambda: aio.run(async_partner().call("k", url, {}))):
            try:
                outcomes.append(call())
            except PartnerUnavailable as exc:  # anything else fails the test
                outcomes.append(type(exc.__cause__).__name__)
    assert all(outcome == 200 or isinstance(outcome, str) for outcome in outcomes), outcomes
