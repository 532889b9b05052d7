"""The partner primitives (breakers, shared rates, parked counts) on both stores.

Each test runs against the in-memory store and the real server. "Another
instance" is a second store object on the same data (a second client for
MongoDB; the same dict for memory, which has no other way to share), and a
restart is a fresh ``Partners`` (and store object) over it. Time is a
``FakeClock`` started at real time (rate windows expire by TTL) and moved by
hand; nothing sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest

from eventbus.breaker import CLOSED, HALF_OPEN, OPEN, Partners
from eventbus.clock import Shift
from eventbus.model.errors import BreakerOpen, PermanentError, RateLimited, TransientError
from eventbus.settings import Settings
from eventbus.store.base import EventStore, Finish, Finished
from eventbus.store.documents import parking
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from tests.contract.conftest import StoreClock, caller_clock, mongo_settings

SETTINGS = Settings(breaker_failures=3, breaker_open_seconds=30, breaker_open_cap_seconds=100,
                    breaker_probe_seconds=10, partner_rate_wait_seconds=1.0)

Twin = Callable[[], EventStore]


@pytest.fixture()
def twin(store: EventStore, store_clock: StoreClock,
         request: pytest.FixtureRequest) -> Iterator[Twin]:
    """Make another store object on the same data: another instance, or one restarted (on the
    same store clock: one server)."""
    made: list[EventStore] = []

    def make() -> EventStore:
        if isinstance(store, MemoryEventStore):
            return store
        from eventbus.store.mongo import MongoEventStore

        database = store.database.name
        assert isinstance(store_clock, Shift)
        other = MongoEventStore.from_settings(
            mongo_settings(request.getfixturevalue("mongo_uri"), database), shift=store_clock)
        made.append(other)
        return other

    yield make
    for other in made:
        other.close()  # type: ignore[attr-defined]


@pytest.fixture()
def clock(store_clock: StoreClock, now: datetime) -> FakeClock:
    """The instances' clock, started at real time; moving it moves the store's clock too."""
    return caller_clock(store_clock, now)


def partners(store: EventStore, clock: FakeClock, settings: Settings = SETTINGS) -> Partners:
    return Partners(store, settings, now=clock)


def boom() -> None:
    raise TransientError("partner answered 503")


def fail(group: Partners, name: str = "acme", times: int = 3) -> None:
    for _ in range(times):
        with pytest.raises(TransientError):
            group.get(name).call(boom)


def doc(store: EventStore, name: str = "acme") -> dict[str, Any]:
    found = store.breaker_get(name)
    assert found is not None
    return found


def state(store: EventStore, name: str = "acme") -> str:
    return str((store.breaker_get(name) or {}).get("state", CLOSED))


# -- the compare-and-swap primitive -------------------------------------------------------
def test_a_breaker_is_created_once_and_moves_only_from_the_version_read(
        store: EventStore) -> None:
    assert store.breaker_get("acme") is None
    assert store.breaker_swap("acme", 0, {"state": OPEN, "failures": 1})
    assert not store.breaker_swap("acme", 0, {"state": CLOSED})
    stored = store.breaker_get("acme")
    assert stored is not None and stored["version"] == 1 and stored["state"] == OPEN
    assert stored["name"] == "acme" and stored["kind"] == "breaker"
    assert not store.breaker_swap("acme", 2, {"state": CLOSED})
    assert store.breaker_swap("acme", 1, {"state": CLOSED})
    assert [doc["name"] for doc in store.breakers()] == ["acme"]


def test_concurrent_swaps_from_one_version_let_exactly_one_win(store: EventStore,
                                                               twin: Twin) -> None:
    store.breaker_swap("acme", 0, {"state": CLOSED})
    others = [twin() for _ in range(2)]
    with ThreadPoolExecutor(6) as pool:
        won = list(pool.map(lambda index: others[index % 2].breaker_swap(
            "acme", 1, {"state": OPEN, "by": index}), range(12)))
    assert won.count(True) == 1


# -- the breaker over the primitives ---------------------------------------------------------
def test_failures_open_it_a_probe_goes_after_the_open_time_and_success_closes(
        store: EventStore, clock: FakeClock) -> None:
    group, calls = partners(store, clock), []
    fail(group)
    assert state(store) == OPEN
    with pytest.raises(BreakerOpen) as refused:
        group.get("acme").call(lambda: calls.append("called"))
    assert calls == [] and refused.value.until == doc(store)["open_until"]
    clock.advance(30)
    assert group.get("acme").call(lambda: calls.append("probe")) is None
    assert calls == ["probe"] and state(store) == CLOSED
    assert doc(store)["failures"] == 0


def test_a_failed_probe_doubles_the_open_time_up_to_the_cap(store: EventStore,
                                                           clock: FakeClock) -> None:
    group = partners(store, clock)
    fail(group)
    lengths = []
    for _ in range(4):
        clock.advance(doc(store)["open_seconds"])
        fail(group, times=1)
        lengths.append(doc(store)["open_seconds"])
    assert lengths == [60, 100, 100, 100]


def test_one_probe_at_a_time_across_instances(store: EventStore, twin: Twin,
                                              clock: FakeClock) -> None:
    fail(partners(store, clock))
    clock.advance(30)
    started, release, calls = threading.Event(), threading.Event(), []

    def probe() -> None:
        calls.append("probe")
        started.set()
        release.wait(5)

    instances = [partners(twin(), clock) for _ in range(3)]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(instances[0].get("acme").call, probe)
        assert started.wait(5)
        for other in instances[1:]:
            with pytest.raises(BreakerOpen):
                other.get("acme").call(lambda: calls.append("second"))
        assert state(store) == HALF_OPEN
        release.set()
        first.result()
    assert calls == ["probe"] and state(store) == CLOSED


def test_a_lost_probe_lets_another_go_after_the_probe_time(store: EventStore,
                                                          clock: FakeClock) -> None:
    group = partners(store, clock)
    fail(group)
    clock.advance(30)
    store.breaker_swap("acme", doc(store)["version"],
                       {**doc(store), "state": HALF_OPEN,
                        "probe_until": clock() + timedelta(seconds=10)})
    with pytest.raises(BreakerOpen):
        group.get("acme").call(lambda: None)
    clock.advance(10)
    group.get("acme").call(lambda: None)
    assert state(store) == CLOSED


def test_a_restart_forgets_nothing(store: EventStore, twin: Twin, clock: FakeClock) -> None:
    fail(partners(store, clock))
    restarted = partners(twin(), clock)
    with pytest.raises(BreakerOpen):
        restarted.get("acme").call(lambda: None)
    clock.advance(30)
    restarted.get("acme").call(lambda: None)
    assert state(twin()) == CLOSED


def test_failures_count_across_instances(store: EventStore, twin: Twin,
                                         clock: FakeClock) -> None:
    fail(partners(store, clock), times=2)
    fail(partners(twin(), clock), times=1)
    assert state(store) == OPEN


def test_a_permanent_answer_counts_as_an_answer_and_other_partners_are_untouched(
        store: EventStore, clock: FakeClock) -> None:
    group = partners(store, clock)
    fail(group, times=2)

    def refused() -> None:
        raise PermanentError("partner answered 400")

    with pytest.raises(PermanentError):
        group.get("acme").call(refused)
    fail(group, times=2)
    assert state(store) == CLOSED
    fail(group, name="globex")
    assert state(store, "globex") == OPEN and state(store) == CLOSED
    assert group.get("acme").call(lambda: "ok") == "ok"


# -- the shared rate -------------------------------------------------------------------------
def test_rate_windows_count_across_instances_and_start_again(store: EventStore, twin: Twin,
                                                             now: datetime) -> None:
    window, expires = now.replace(microsecond=0), now + timedelta(minutes=5)
    stores = [store, twin(), twin()]
    with ThreadPoolExecutor(6) as pool:
        counts = list(pool.map(lambda index: stores[index % 3].rate_take("acme", window,
                                                                         expires), range(30)))
    assert sorted(counts) == list(range(1, 31))
    assert store.rate_take("acme", window + timedelta(seconds=1), expires) == 1
    assert store.rate_take("globex", window, expires) == 1


def test_over_the_rate_a_call_waits_for_the_next_window_or_parks(store: EventStore,
                                                               twin: Twin,
                                                               clock: FakeClock) -> None:
    settings = Settings(partner_rate=2, partner_rates=(("slow", 0.25),),
                        partner_rate_wait_seconds=1.0)
    clock.moment = clock.moment.replace(microsecond=0)
    first, second = partners(store, clock, settings), partners(twin(), clock, settings)
    calls: list[str] = []
    first.get("acme").call(lambda: calls.append("a"))
    second.get("acme").call(lambda: calls.append("b"))
    started = clock()
    first.get("acme").call(lambda: calls.append("c"))  # waited for the next window
    assert calls == ["a", "b", "c"] and clock() - started == timedelta(seconds=1)
    clock.advance(4 - clock().timestamp() % 4)  # the start of a 4-second window
    second.get("slow").call(lambda: calls.append("d"))
    with pytest.raises(RateLimited) as parked:
        first.get("slow").call(lambda: calls.append("e"))  # the next window is 4 s away
    assert calls[-1] == "d" and parked.value.until == clock() + timedelta(seconds=4)
    with pytest.raises(RateLimited) as later:
        first.get("slow").call(lambda: calls.append("f"))
    assert later.value.until == clock() + timedelta(seconds=8)  # behind the one parked first


# -- parked events ---------------------------------------------------------------------------
def test_parked_events_are_counted_by_partner(store: EventStore, now: datetime) -> None:
    from tests.contract.conftest import FIELDS, new_key

    keys = [new_key() for _ in range(3)]
    for index, key in enumerate(keys):
        claim = store.claim(key, FIELDS, now)
        parked = {"type": "BreakerOpen", "message": "open", "classification": "parked",
                  "partner": "acme" if index else "globex", "until": now}
        assert store.finish_many([Finish(key, claim.owner, error=parked, retryable=True,
                                         redrive_at=now, parked=True)], now) == Finished()
        record = store.get(key) or {}
        assert record["parks"] == parking.parks(record) == 1  # counted beside the error
        assert parking.is_parked(record)
    other = new_key()
    store.fail(other, store.claim(other, FIELDS, now).owner, now,
               {"type": "X", "message": "", "classification": "transient"}, retryable=True)
    assert store.parked_counts() == {"acme": 2, "globex": 1}


def test_unpark_makes_a_partners_parked_events_due_now(store: EventStore,
                                                       now: datetime) -> None:
    from tests.contract.conftest import FIELDS, new_key

    later = now + timedelta(hours=1)
    keys = {name: new_key() for name in ("acme", "globex")}
    for name, key in keys.items():
        claim = store.claim(key, FIELDS, now)
        error = {"type": "BreakerOpen", "message": "", "classification": "parked",
                 "partner": name, "until": later}
        assert store.finish_many([Finish(key, claim.owner, error=error, retryable=True,
                                         redrive_at=later, parked=True)], now) == Finished()
    assert store.redrivable(10) == []
    assert store.unpark("acme", now) == 1
    due = {record["idempotency_key"] for record in store.redrivable(10)}
    assert due == {keys["acme"]}
    assert (store.get(keys["acme"]) or {})["parks"] == 1  # unparking does not forget it


def test_reset_forgets_the_breakers_too(store: EventStore, clock: FakeClock) -> None:
    fail(partners(store, clock))
    store.reset()
    assert store.breaker_get("acme") is None and store.breakers() == []


def test_a_probe_that_closes_the_breaker_brings_its_parked_events_back(
        store: EventStore, clock: FakeClock) -> None:
    from tests.contract.conftest import FIELDS, new_key

    group, key, later = partners(store, clock), new_key(), clock() + timedelta(hours=1)
    fail(group)
    claim = store.claim(key, FIELDS, clock())
    error = {"type": "BreakerOpen", "message": "", "classification": "parked",
             "partner": "acme", "until": later}
    assert store.finish_many([Finish(key, claim.owner, error=error, retryable=True,
                                     redrive_at=later, parked=True)], clock()) == Finished()
    clock.advance(30)
    assert {r["idempotency_key"] for r in store.redrivable(10)} == set()
    group.get("acme").call(lambda: None)  # the probe answers
    assert {r["idempotency_key"] for r in store.redrivable(10)} == {key}
