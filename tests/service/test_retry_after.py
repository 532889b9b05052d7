"""``raise RetryAfter(...)``: acked, stored retryable at its time on the store's clock, the
attempt spent, brought back by the redrive then and not before (issue 43, item 1)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eventbus import Router
from eventbus.http.retry_after import parse, retry_after
from eventbus.model.context import Context
from eventbus.model.errors import RetryAfter, TransientError
from eventbus.model.outcome import Outcome
from eventbus.settings import Settings
from eventbus.testing import LocalBus
from tests.closing import app_closed_after_test, closed_after_test
from tests.hypothesis_profiles import examples

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
LONGEST = 86400.0


def bus_raising(when: Any, wrapped: bool = False, **settings: Any) -> LocalBus:
    routes = Router()

    @routes.handler("ORDER")
    def later(context: Context) -> None:
        if wrapped:  # a handler's own error, raised from the partner's request
            raise TransientError("partner busy") from RetryAfter(when, "busy")
        raise RetryAfter(when, "partner asked")

    return closed_after_test(LocalBus(routes, settings=Settings(relay_inline=False,
                                                                **settings)))


def publish(bus: LocalBus, n: int = 1) -> Any:
    bus.publish("ORDER", {"n": n}, entity={"partnerId": "p1", "entity_id": f"o-{n}",
                                           "entity_type": "Order"})
    return bus.results[-1]


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_retry_after_is_acked_stored_for_its_time_and_spends_the_attempt(
        wrapped: bool) -> None:
    bus = bus_raising(120, wrapped)
    result = publish(bus)
    assert result.outcome is Outcome.DEFERRED and result.outcome.acked
    record = bus.store.get(result.key) or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is True
    assert record["error"]["classification"] == "retry_after"
    due = record["redrive_at"]
    assert due == bus.store.now() + dt.timedelta(seconds=120)
    assert record["error"]["until"] == due
    assert int(record.get("attempts") or 0) == 1  # spent, unlike a park
    # The redrive leaves it until then, and takes it at its time.
    assert result.key not in {r["idempotency_key"] for r in bus.store.redrivable(10)}
    bus.clock.advance(121)
    assert result.key in {r["idempotency_key"] for r in bus.store.redrivable(10)}


def test_a_retry_after_past_the_attempt_cap_fails_for_good() -> None:
    bus = bus_raising(5, max_attempts=2)
    first = publish(bus)
    assert first.outcome is Outcome.DEFERRED and first.attempt == 1
    bus.clock.advance(6)  # its time came
    final = bus.redeliver(first.key)  # attempt 2 is the cap, as for any transient error
    assert final.outcome is Outcome.REJECTED and final.attempt == 2  # nothing retried forever
    record = bus.store.get(first.key) or {}
    assert record["retryable"] is False and record["error"]["classification"] == "attempt_cap"


HOSTILE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**80),
                                                                max_value=2**80),
    st.text(max_size=40), st.none(), st.booleans(), st.binary(max_size=8),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.lists(st.integers(), max_size=3))


@given(HOSTILE)
@example(math.nan)
@example(-1e308)
@example(dt.datetime(1970, 1, 1, tzinfo=dt.UTC))
@example(dt.datetime(9999, 12, 31))
@example("Wed, 21 Oct 2026 07:28:00 GMT")
@settings(max_examples=examples(100), deadline=None)
def test_any_value_is_a_bounded_wait_never_an_error(when: Any) -> None:
    seconds = RetryAfter(when).delay(NOW, LONGEST)
    assert RetryAfter.SHORTEST <= seconds <= LONGEST


def test_seconds_and_datetimes_wait_as_asked() -> None:
    assert RetryAfter(90).delay(NOW, LONGEST) == 90
    assert RetryAfter("30").delay(NOW, LONGEST) == 30
    assert RetryAfter(NOW + dt.timedelta(minutes=5)).delay(NOW, LONGEST) == 300
    assert RetryAfter(dt.datetime(2026, 12, 3, 12, 10)).delay(NOW, LONGEST) == 600  # naive: UTC
    assert RetryAfter(NOW - dt.timedelta(days=1)).delay(NOW, LONGEST) == RetryAfter.SHORTEST
    assert RetryAfter(10**9).delay(NOW, LONGEST) == LONGEST


def test_the_header_reads_seconds_and_http_dates_and_nothing_else() -> None:
    assert parse("120") == 120.0 and parse(" 7 ") == 7.0
    assert parse("Wed, 21 Oct 2026 07:28:00 GMT") == dt.datetime(2026, 10, 21, 7, 28,
                                                                   tzinfo=dt.UTC)
    assert [parse(text) for text in ("", None, "-5", "soon", "1.5", "\x00", "\ud800")] == \
        [None] * 7
    asked = retry_after(429, "60", "partner answered 429")
    assert isinstance(asked, RetryAfter) and asked.delay(NOW, LONGEST) == 60
    assert retry_after(500, "60", "x") is None and retry_after(503, "garbage", "x") is None


@given(st.text(max_size=60))
@settings(max_examples=examples(100), deadline=None)
def test_any_header_parses_or_is_none(header: str) -> None:
    found = parse(header)
    assert found is None or isinstance(found, float | dt.datetime)
    if isinstance(found, dt.datetime):
        assert found.tzinfo is not None


def test_the_push_answers_200_for_a_deferred_event() -> None:
    from eventbus import create_app
    from eventbus.store.memory import MemoryEventStore
    from tests.service.conftest import wrapped

    routes = Router()

    @routes.handler("ORDER")
    def later(context: Context) -> None:
        raise RetryAfter(60, "partner asked")

    store = MemoryEventStore()
    app = app_closed_after_test(create_app(routes, Settings(relay_inline=False), store))
    answer = app.test_client().post("/", json=wrapped(
        {"event_type": "ORDER", "event_version": "v1",
         "entity_metadata": {"partnerId": "p1", "entity_id": "o-1", "entity_type": "Order"},
         "entity_data": {}}))
    assert answer.status_code == 200 and answer.get_json()["outcome"] == "deferred"
    assert (store.get(answer.get_json()["idempotency_key"]) or {})["retryable"] is True


def test_a_partner_wide_retry_after_pauses_the_partners_other_calls_until_then() -> None:
    from eventbus.model.errors import BreakerOpen
    from eventbus.partners import OPEN, BreakerState, Partners
    from eventbus.store.memory import MemoryEventStore
    from eventbus.testing import FakeClock
    from tests.partner_stores import beside

    clock = FakeClock(NOW)
    store = MemoryEventStore(clock=clock)
    group = Partners.beside(store, Settings(), now=clock)
    asked = retry_after(429, "120", "partner answered 429")
    assert asked is not None and asked.partner_wide

    def limited() -> None:
        raise TransientError("partner answered 429") from asked

    with pytest.raises(TransientError) as first:  # this call's own error, not BreakerOpen
        group.get("acme").call(limited)
    assert not isinstance(first.value, BreakerOpen)
    state = BreakerState.from_document(beside(store).breaker_get("acme"))
    assert state.state == OPEN and state.open_until == store.now() + dt.timedelta(seconds=120)
    assert (state.reason or {})["cause"] == "retry after"
    with pytest.raises(BreakerOpen) as second:  # the partner's other calls wait with it
        group.get("acme").call(lambda: None)
    assert second.value.until == state.open_until


def test_an_event_scoped_retry_after_leaves_the_breaker_alone() -> None:
    from eventbus.partners import Partners
    from eventbus.store.memory import MemoryEventStore
    from eventbus.testing import FakeClock
    from tests.partner_stores import beside

    clock = FakeClock(NOW)
    store = MemoryEventStore(clock=clock)
    group = Partners.beside(store, Settings(), now=clock)
    asked = retry_after(503, "120", "partner answered 503")
    assert asked is not None and not asked.partner_wide

    def busy() -> None:
        raise TransientError("partner answered 503") from asked

    with pytest.raises(TransientError):
        group.get("acme").call(busy)
    stored = beside(store).breaker_get("acme") or {}
    assert stored.get("state", "closed") == "closed"  # one failure: under the threshold
    assert group.get("acme").call(lambda: "ok") == "ok"


def test_a_duplicate_delivery_before_its_time_is_answered_and_never_run_early() -> None:
    """The known gap of issue 43: the claim took a deferred record and dropped its time."""
    runs: list[int] = []
    routes = Router()

    @routes.handler("ORDER")
    def later(context: Context) -> None:
        runs.append(context.attempt)
        if len(runs) == 1:
            raise RetryAfter(120, "partner asked")

    bus = closed_after_test(LocalBus(routes, settings=Settings(relay_inline=False)))
    first = publish(bus)
    assert first.outcome is Outcome.DEFERRED
    early = bus.redeliver(first.key)  # Pub/Sub's duplicate, a minute before the time
    assert early.outcome is Outcome.DUPLICATE and early.outcome.acked and runs == [1]
    record = bus.store.get(first.key) or {}
    assert record["event_status"] == "FAILED" and record["not_before"] == record["redrive_at"]
    bus.clock.advance(121)
    due = bus.redeliver(first.key)  # the redrive's publication, at its time
    assert due.outcome is Outcome.PROCESSED and runs == [1, 2]
    assert "not_before" not in (bus.store.get(first.key) or {})


def test_a_replay_of_a_deferred_event_runs_it_now() -> None:
    from eventbus.store.documents import NOT_BEFORE

    bus = bus_raising(3600)
    first = publish(bus)
    assert NOT_BEFORE in (bus.store.get(first.key) or {})
    after = bus.store.record_replay(first.key, {"by": "test"}, bus.store.now(), reopen=True,
                                    redrive_at=bus.store.now())
    assert after is not None and NOT_BEFORE not in after
    assert bus.redeliver(first.key).outcome is Outcome.DEFERRED  # taken and run again
