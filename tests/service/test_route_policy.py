"""A policy per route (issue 43 item 2, part): ``max_attempts`` and ``max_age`` on
``Router.handler``, checked at start-up, decided on the store's clock."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import Router
from eventbus.model.context import Context
from eventbus.model.delivery import FIRST_PUBLISH_TIME, Delivery
from eventbus.model.errors import RetryAfter, TransientError
from eventbus.model.outcome import Outcome
from eventbus.partners import Partners
from eventbus.processor import Processor
from eventbus.pubsub.message import build_event, build_message
from eventbus.rebuild.mode import ReplayMode
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock
from eventbus.workers import original
from eventbus.workers.redrive import Redriver
from tests.hypothesis_profiles import examples

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
SETTINGS = Settings(relay_inline=False, max_attempts=5)


def delivery(event_type: str, published: dt.datetime, n: int = 1) -> Delivery:
    event = build_event(event_type, {"n": n}, entity={"partnerId": "p1", "entity_id": f"o-{n}",
                                                      "entity_type": "Order"})
    body, attributes = build_message(event)
    return Delivery(body, attributes, message_id=f"m-{n}",
                    publish_time=published.isoformat().replace("+00:00", "Z"))


def processor(store: MemoryEventStore, routes: Router, offset: float = 0.0) -> Processor:
    host = FakeClock(NOW + dt.timedelta(seconds=offset))  # this instance's own clock
    return Processor(store, routes, SETTINGS, host, partners=Partners.beside(store, SETTINGS))


def test_a_routes_own_attempt_cap_applies_and_others_keep_the_settings() -> None:
    routes, calls = Router(), {"SHORT": 0, "LONG": 0}

    @routes.handler("SHORT", max_attempts=2)
    def short(context: Context) -> None:
        calls["SHORT"] += 1
        raise TransientError("down")

    @routes.handler("LONG")
    def long(context: Context) -> None:
        calls["LONG"] += 1
        raise TransientError("down")

    store = MemoryEventStore(clock=FakeClock(NOW))
    with contextlib.closing(processor(store, routes)) as run:
        short_outcomes = [run.process(delivery("SHORT", NOW)).outcome for _ in range(3)]
        long_outcomes = [run.process(delivery("LONG", NOW)).outcome for _ in range(3)]
    assert short_outcomes == [Outcome.RETRY, Outcome.REJECTED, Outcome.DUPLICATE]
    assert long_outcomes == [Outcome.RETRY] * 3
    assert calls == {"SHORT": 2, "LONG": 3}


@pytest.mark.parametrize("offset", [-600.0, 0.0, 600.0])  # hosts ten minutes apart agree
def test_an_event_past_its_max_age_is_failed_for_good_unrun_on_the_stores_clock(
        offset: float) -> None:
    routes, ran = Router(), []

    @routes.handler("NOTIFY", max_age=dt.timedelta(hours=1))
    def notify(context: Context) -> None:
        ran.append(context.key)

    store = MemoryEventStore(clock=FakeClock(NOW))
    with contextlib.closing(processor(store, routes, offset)) as run:
        late = run.process(delivery("NOTIFY", NOW - dt.timedelta(hours=3), n=1))
        fresh = run.process(delivery("NOTIFY", NOW - dt.timedelta(minutes=5), n=2))
    assert late.outcome is Outcome.REJECTED and late.outcome.acked
    assert fresh.outcome is Outcome.PROCESSED and ran == [fresh.key]
    record = store.get(late.key) or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is False
    assert record["error"]["classification"] == "expired"
    assert "max_age of 3600 s" in record["error"]["message"]


def test_an_event_without_a_publish_time_is_not_expired() -> None:
    routes, ran = Router(), []

    @routes.handler("NOTIFY", max_age=60)
    def notify(context: Context) -> None:
        ran.append(context.key)

    store = MemoryEventStore(clock=FakeClock(NOW))
    event = build_event("NOTIFY", {}, entity={"partnerId": "p1", "entity_id": "o",
                                              "entity_type": "Order"})
    body, attributes = build_message(event)
    with contextlib.closing(processor(store, routes)) as run:
        assert run.process(Delivery(body, attributes, message_id="m")).outcome \
            is Outcome.PROCESSED
    assert len(ran) == 1


def test_a_rebuild_ignores_max_age() -> None:
    assert ReplayMode.honours_max_age is False


@pytest.mark.parametrize("options", [
    {"max_attempts": 0}, {"max_attempts": -1}, {"max_attempts": True}, {"max_attempts": 1.5},
    {"max_attempts": "3"}, {"max_age": 0}, {"max_age": -5}, {"max_age": math.nan},
    {"max_age": math.inf}, {"max_age": "60"}, {"max_age": dt.timedelta(0)},
    {"max_age": True}])
def test_an_impossible_policy_is_refused_at_start_up_naming_the_route(
        options: dict[str, Any]) -> None:
    routes = Router()
    with pytest.raises(ValueError, match="route 'NOTIFY'"):
        routes.handler("NOTIFY", **options)(lambda context: None)


def _redriven(store: MemoryEventStore, run: Processor) -> Delivery:
    """The one message the redrive sweeper publishes now, as Pub/Sub delivers it: stamped
    with a new publishTime, the store's now."""
    published = CapturingPublisher()
    Redriver(store, published, SETTINGS, now=store.now, locate=run.locate).sweep()
    (message,) = published.take()
    return Delivery(message.data, message.attributes, message_id=message.message_id,
                    publish_time=store.now().isoformat().replace("+00:00", "Z"))


@pytest.mark.parametrize("offset", [-600.0, 600.0])
def test_a_redriven_event_keeps_its_first_publish_time_for_max_age(offset: float) -> None:
    """Pub/Sub stamps the redrive's message anew; its age still counts from the first publish
    (simulation seeds 32, 198, 143, 212 ran it past its max_age when it did not)."""
    routes, ran = Router(), []

    @routes.handler("NOTIFY", max_age=900)
    def notify(context: Context) -> None:
        ran.append(context.key)
        raise RetryAfter(600, "partner asked")

    clock = FakeClock(NOW)
    store = MemoryEventStore(clock=clock)
    with contextlib.closing(processor(store, routes, offset)) as run:
        first = run.process(delivery("NOTIFY", NOW - dt.timedelta(seconds=100)))
        assert first.outcome is Outcome.DEFERRED and len(ran) == 1
        clock.advance(601)  # due: 701 s after the first publish, within max_age
        again = run.process(_redriven(store, run))
        assert again.outcome is Outcome.DEFERRED and len(ran) == 2
        clock.advance(601)  # 1,302 s after the first publish: past it, however young the message
        redriven = _redriven(store, run)
        assert redriven.attributes[FIRST_PUBLISH_TIME] == "2026-12-03T11:58:20Z"
        late = run.process(redriven)
    assert late.outcome is Outcome.REJECTED and len(ran) == 2
    assert (store.get(late.key) or {})["error"]["classification"] == "expired"


def test_the_first_publish_time_is_the_earliest_known() -> None:
    record = {"idempotency_key": "k", "pubsub": {
        "publishTime": "2026-12-03T11:00:00Z",
        "attributes": {FIRST_PUBLISH_TIME: "2026-12-01T00:00:00Z", "idempotency_key": "k"}}}
    assert original.first_publish_time(record) == "2026-12-01T00:00:00Z"
    forged = {"pubsub": {"publishTime": "2026-12-03T11:00:00Z",
                         "attributes": {FIRST_PUBLISH_TIME: "2030-01-01T00:00:00Z"}}}
    assert original.first_publish_time(forged) == "2026-12-03T11:00:00Z"  # never younger


@given(st.one_of(st.text(max_size=60), st.none(), st.integers(), st.binary(max_size=20)))
@settings(max_examples=examples(100))
def test_a_hostile_first_publish_time_never_makes_an_event_younger(value: Any) -> None:
    published = "2026-12-03T11:00:00Z"
    attributes = {FIRST_PUBLISH_TIME: value}
    moment = Delivery(b"{}", attributes, publish_time=published).first_published_at()
    assert moment is not None and moment <= dt.datetime(2026, 12, 3, 11, tzinfo=dt.UTC)
