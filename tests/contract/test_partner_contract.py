"""The partner primitives (breakers, shared rates, parked counts) on both stores.

Each test runs against the in-memory store and the real server. "Another
instance" is a second store object on the same data (a second client for
MongoDB; the same dict for memory, which has no other way to share), and a
restart is a fresh ``Partners`` (and store object) over it.

Time is **the store's clock**, the only one breakers and rates are decided
on: the memory store's ``FakeClock``, or the server's clock moved by a
``Shift`` (both start at real time: rate buckets expire by TTL), moved by
hand and by the partners' waits; nothing sleeps. Each ``Partners`` gets its
own process clock ten minutes ahead of or behind the store's, which must
change nothing. On the server, real time also runs between two calls (a few
milliseconds): the rate tests read each decision's time from the store
(``RateTake.at``) instead of assuming it.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from eventbus.clock import Shift, bson_time
from eventbus.model.errors import BreakerOpen, PermanentError, RateLimited, TransientError
from eventbus.partners import CLOSED, HALF_OPEN, OPEN, Partners
from eventbus.partners import documents as partner_documents
from eventbus.partners.documents import RateLimit, RateTake, rate_step
from eventbus.settings import Settings
from eventbus.store.base import EventStore, Finish, Finished
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from tests.contract.conftest import StoreClock, mongo_settings
from tests.partner_stores import beside

SETTINGS = Settings(breaker_failures=3, breaker_open_seconds=30, breaker_open_cap_seconds=100,
                    breaker_probe_seconds=10, partner_rate_wait_seconds=1.0)
SKEW = timedelta(minutes=10)
MS = timedelta(milliseconds=1)

Twin = Callable[[], EventStore]


@pytest.fixture()
def moves(store_clock: StoreClock) -> StoreClock:
    """What moves the store's clock: the memory store's ``FakeClock``, the server's ``Shift``."""
    return store_clock


@pytest.fixture()
def twin(store: EventStore, moves: StoreClock,
         request: pytest.FixtureRequest) -> Iterator[Twin]:
    """Make another store object on the same data and clock: another instance, or a restart."""
    made: list[EventStore] = []

    def make() -> EventStore:
        if isinstance(store, MemoryEventStore):
            return store
        from eventbus.store.mongo import MongoEventStore

        assert isinstance(moves, Shift)
        database = store.database.name
        other = MongoEventStore.from_settings(
            mongo_settings(request.getfixturevalue("mongo_uri"), database), shift=moves)
        made.append(other)
        return other

    yield make
    for other in made:
        other.close()  # type: ignore[attr-defined]


@dataclasses.dataclass
class StoreTime:
    """The store's clock as a test reads and moves it."""

    store: EventStore
    moves: StoreClock

    def __call__(self) -> datetime:
        """The store's time now."""
        return self.store.now()

    moment: datetime | None = None
    """Where ``step`` has put the server's clock (None until first stepped)."""

    def advance(self, seconds: float) -> None:
        """Move the store's clock (and so every instance's shared time) on."""
        self.moves.advance(seconds)

    def step(self, seconds: float) -> None:
        """Move the store's clock to ``seconds`` after the previous step, whatever real time ran.

        On the server real time runs on between two steps, and on a loaded machine
        seconds can pass: tokens would come free that the test's timeline has not
        reached. This takes that time back out, as the model's world does.
        """
        if isinstance(self.moves, FakeClock):
            self.moves.advance(seconds)
            return
        self.moment = (self.moment or self.store.now()) + timedelta(seconds=seconds)
        self.moves.advance((self.moment - self.store.now()).total_seconds())

    @property
    def exact(self) -> bool:
        """True when no real time runs between two calls (the memory store)."""
        return isinstance(self.moves, FakeClock)

    @property
    def slack(self) -> timedelta:
        """How far two readings of "the same" store time may differ (the server's round trips)."""
        # A loaded machine (CI beside other jobs) can take over 100 ms between two calls.
        return timedelta(0) if self.exact else timedelta(seconds=1)


@pytest.fixture()
def clock(store: EventStore, moves: StoreClock) -> StoreTime:
    return StoreTime(store, moves)


def partners(store: EventStore, clock: StoreTime, settings: Settings = SETTINGS, *,
             skew: timedelta = SKEW) -> Partners:
    """An instance whose own clock is ``skew`` off the store's; its waits move the store's."""
    return Partners.beside(store, settings, now=FakeClock(datetime.now(UTC) + skew),
                    sleep=clock.advance)


def boom() -> None:
    raise TransientError("partner answered 503")


def fail(group: Partners, name: str = "acme", times: int = 3) -> None:
    for _ in range(times):
        with pytest.raises(TransientError):
            group.get(name).call(boom)


def doc(store: EventStore, name: str = "acme") -> dict[str, Any]:
    found = beside(store).breaker_get(name)
    assert found is not None
    return found


def state(store: EventStore, name: str = "acme") -> str:
    return str((beside(store).breaker_get(name) or {}).get("state", CLOSED))


# -- the compare-and-swap primitive -------------------------------------------------------
def test_a_breaker_is_created_once_and_moves_only_from_the_version_read(
        store: EventStore) -> None:
    assert beside(store).breaker_get("acme") is None
    assert beside(store).breaker_swap("acme", 0, {"state": OPEN, "failures": 1})
    assert not beside(store).breaker_swap("acme", 0, {"state": CLOSED})
    stored = beside(store).breaker_get("acme")
    assert stored is not None and stored["version"] == 1 and stored["state"] == OPEN
    assert stored["name"] == "acme" and stored["kind"] == "breaker"
    assert not beside(store).breaker_swap("acme", 2, {"state": CLOSED})
    assert beside(store).breaker_swap("acme", 1, {"state": CLOSED})
    assert [doc["name"] for doc in beside(store).breakers()] == ["acme"]


def test_concurrent_swaps_from_one_version_let_exactly_one_win(store: EventStore,
                                                               twin: Twin) -> None:
    beside(store).breaker_swap("acme", 0, {"state": CLOSED})
    others = [twin() for _ in range(2)]
    with ThreadPoolExecutor(6) as pool:
        won = list(pool.map(lambda index: beside(others[index % 2]).breaker_swap(
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

    instances = [partners(twin(), clock, skew=skew) for skew in (-SKEW, SKEW, 3 * SKEW)]
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
    beside(store).breaker_swap("acme", doc(store)["version"],
                       {**doc(store), "state": HALF_OPEN,
                        "probe_until": clock() + timedelta(seconds=10)})
    with pytest.raises(BreakerOpen):
        group.get("acme").call(lambda: None)
    clock.advance(10)
    group.get("acme").call(lambda: None)
    assert state(store) == CLOSED


def test_a_restart_forgets_nothing(store: EventStore, twin: Twin, clock: FakeClock) -> None:
    fail(partners(store, clock))
    restarted = partners(twin(), clock, skew=-SKEW)
    with pytest.raises(BreakerOpen):
        restarted.get("acme").call(lambda: None)
    clock.advance(30)
    restarted.get("acme").call(lambda: None)
    assert state(twin()) == CLOSED


def test_failures_count_across_instances(store: EventStore, twin: Twin,
                                         clock: FakeClock) -> None:
    fail(partners(store, clock), times=2)
    fail(partners(twin(), clock, skew=-SKEW), times=1)
    assert state(store) == OPEN


def test_instances_whose_clocks_differ_by_minutes_share_one_breaker_timeline(
        store: EventStore, twin: Twin, clock: StoreTime) -> None:
    behind, ahead = partners(store, clock, skew=-SKEW), partners(twin(), clock, skew=SKEW)
    calls: list[str] = []
    before = clock()
    fail(behind)
    opened = doc(store)
    assert bson_time(before) <= opened["opened_at"] <= clock()  # the store's, not an instance's
    assert opened["open_until"] == opened["opened_at"] + timedelta(seconds=30)
    with pytest.raises(BreakerOpen) as refused:  # ten minutes ahead changes nothing
        ahead.get("acme").call(lambda: calls.append("early"))
    assert calls == [] and refused.value.until == opened["open_until"]
    clock.advance(30)
    behind.get("acme").call(lambda: calls.append("probe"))  # nor ten minutes behind
    assert calls == ["probe"] and state(store) == CLOSED


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
NO_WAIT = timedelta(0)


def admitted(takes: Sequence[RateTake]) -> list[datetime]:
    """When each taken call may go (its token's time), in order."""
    return sorted(take.until for take in takes if take.taken)


def most_in_any_span(times: Sequence[datetime], limit: RateLimit) -> list[tuple[int, float]]:
    """Every span between two admissions whose count is over ``rate * span + burst``."""
    over = []
    for first in range(len(times)):
        for last in range(first, len(times)):
            span = (times[last] - times[first]) / MS
            count = last - first + 1
            if count > span / limit.interval_ms + limit.burst:
                over.append((count, span))
    return over


def test_a_refused_call_learns_when_the_next_token_is_free(store: EventStore,
                                                          clock: StoreTime) -> None:
    limit = RateLimit(interval_ms=500, burst=2)
    first, second, third = (beside(store).rate_take("acme", limit, NO_WAIT) for _ in range(3))
    assert first.taken and second.taken and first.wait == second.wait == NO_WAIT
    assert not third.taken and third.until == first.at + timedelta(milliseconds=500)
    assert third.wait == third.until - third.at > NO_WAIT
    clock.advance((third.wait - 200 * MS).total_seconds())
    # refusals spend nothing: the same token
    early = beside(store).rate_take("acme", limit, NO_WAIT)
    assert not early.taken and early.until == third.until
    if clock.exact:
        clock.advance(0.199)
        assert beside(store).rate_take("acme", limit, NO_WAIT).wait == MS
    clock.advance(0.2)
    on_time = beside(store).rate_take("acme", limit, NO_WAIT)
    assert on_time.taken and on_time.wait == NO_WAIT
    assert not beside(store).rate_take("acme", limit, NO_WAIT).taken
    # each partner has its own bucket
    assert beside(store).rate_take("globex", limit, NO_WAIT).taken


def test_a_call_within_the_longest_wait_reserves_its_token_and_later_ones_queue(
        store: EventStore) -> None:
    limit, longest = RateLimit(interval_ms=500, burst=2), timedelta(seconds=1)
    takes = [beside(store).rate_take("acme", limit, longest) for _ in range(5)]
    start = takes[0].at
    assert [take.taken for take in takes] == [True, True, True, True, False]
    assert takes[0].wait == takes[1].wait == NO_WAIT
    assert [take.until - start for take in takes[2:]] == [500 * MS, 1000 * MS, 1500 * MS]
    assert takes[3].wait <= longest < takes[4].wait


def test_at_any_rate_no_span_admits_more_than_rate_times_span_plus_burst(
        store: EventStore, clock: StoreTime) -> None:
    """Random gaps, bursts and boundary instants: every span is checked, not one window.

    Each decision is also the pure rule's (``rate_step``) at the store's own
    time of it, so the server's pipeline and the memory store agree.
    """
    gaps = random.Random(6).choices([0, 0, 0, 0.001, 0.1, 0.249, 0.25, 0.499, 0.5, 0.999, 1.5],
                                    k=150)
    for limit, longest in ((RateLimit(250, 3), NO_WAIT), (RateLimit(500, 1), NO_WAIT),
                           (RateLimit(250, 3), timedelta(milliseconds=600))):
        name, takes, tat = f"p-{limit.interval_ms}-{limit.burst}-{longest / MS:g}", [], None
        for gap in gaps:
            clock.advance(gap)
            take = beside(store).rate_take(name, limit, longest)
            expected, tat = rate_step(tat, take.at, limit, longest)
            assert take == expected
            takes.append(take)
        times = admitted(takes)
        assert most_in_any_span(times, limit) == []
        assert 0 < len(times) < len(takes)  # the sequence did meet the limit


def test_no_double_rate_across_a_window_boundary(store: EventStore, clock: StoreTime) -> None:
    limit = RateLimit(interval_ms=500, burst=2)  # 2 calls/s
    clock.advance((0.99 - clock().timestamp()) % 1)  # 10 ms before a whole second
    before = [beside(store).rate_take("acme", limit, NO_WAIT) for _ in range(4)]
    clock.advance(0.02)  # 10 ms after it: a fixed window would start counting again
    after = [beside(store).rate_take("acme", limit, NO_WAIT) for _ in range(4)]
    assert [take.taken for take in before + after] == [True, True] + [False] * 6


def test_takes_from_many_instances_at_once_never_overspend(store: EventStore,
                                                          twin: Twin) -> None:
    # A second's wait absorbs two concurrent commands whose $$NOW came in the
    # other order than their writes; the sixth token is an hour away.
    limit, longest = RateLimit(interval_ms=3_600_000, burst=5), timedelta(seconds=1)
    stores = [store, twin(), twin()]
    with ThreadPoolExecutor(6) as pool:
        takes = list(pool.map(
            lambda index: beside(stores[index % 3]).rate_take("acme", limit, longest), range(30)))
    assert sum(take.taken for take in takes) == 5
    [until] = {take.until for take in takes if not take.taken}  # one next token for all
    times = [take.at for take in takes if take.taken]
    assert min(times) + timedelta(hours=1) <= until <= max(times) + timedelta(hours=1)


def test_instances_whose_clocks_differ_by_minutes_get_exactly_the_same_admissions(
        store: EventStore, twin: Twin, clock: StoreTime) -> None:
    """One partner paced by two instances 10 minutes ahead and behind, one by an exact one."""
    # One per 4 s, two at once, and no wait: 0 s is below what EVENTBUS_PARTNER_RATE_WAIT_SECONDS
    # takes (above 0), so the copy is not validated (model_copy, as dataclasses.replace was not).
    settings = SETTINGS.model_copy(update={"partner_rate": 0.25, "partner_burst_seconds": 8.0,
                                           "partner_rate_wait_seconds": 0.0})
    skewed = [partners(store, clock, settings, skew=SKEW),
              partners(twin(), clock, settings, skew=-SKEW)]
    exact = partners(twin(), clock, settings, skew=timedelta(0))
    outcomes: dict[str, list[tuple[str, datetime | None]]] = {"acme": [], "globex": []}
    clock.step(0)  # the timeline starts here
    for step in range(24):
        for name, group in (("acme", skewed[step % 2]), ("globex", exact)):
            try:
                group.get(name).call(lambda: None)
                outcomes[name].append(("called", None))
            except RateLimited as refused:
                outcomes[name].append(("parked", refused.until))
        # Half a second off the tokens' times from then on (they fall on the first call's
        # time plus multiples of 4 s), so no call ties with one: on the server a tie would
        # go either way by milliseconds.
        clock.step(1.5 if step == 0 else 1.0)
    kinds = {name: [kind for kind, _ in seen] for name, seen in outcomes.items()}
    assert kinds["acme"] == kinds["globex"]
    # The burst of two, then one per 4 s (on a fixed-window clock per instance,
    # the instances 20 minutes apart would each have had their own windows).
    assert [step for step, kind in enumerate(kinds["acme"]) if kind == "called"] == \
        [0, 1, 4, 8, 12, 16, 20]
    for (_, until), (_, same) in zip(outcomes["acme"], outcomes["globex"], strict=True):
        assert (until is None) == (same is None)
        assert until is None or same is None or abs(until - same) <= clock.slack


def test_over_the_rate_a_call_waits_for_its_token_or_parks_until_the_next(
        store: EventStore, twin: Twin, clock: StoreTime) -> None:
    settings = SETTINGS.replace(partner_rate=2, partner_rates=(("slow", 0.25),),
                                partner_rate_wait_seconds=1.0)
    first = partners(store, clock, settings)
    second = partners(twin(), clock, settings, skew=-SKEW)
    calls: list[str] = []
    first.get("acme").call(lambda: calls.append("a"))
    second.get("acme").call(lambda: calls.append("b"))  # the burst: two at once
    started = clock()
    first.get("acme").call(lambda: calls.append("c"))  # waited for the next token
    waited = clock() - started
    assert calls == ["a", "b", "c"] and timedelta(milliseconds=400) < waited
    assert waited == timedelta(milliseconds=500) or not clock.exact
    second.get("slow").call(lambda: calls.append("d"))  # one every 4 s, a burst of one
    token = clock() + timedelta(seconds=4)
    with pytest.raises(RateLimited) as parked:
        first.get("slow").call(lambda: calls.append("e"))  # 4 s away: over the longest wait
    assert calls[-1] == "d" and abs(parked.value.until - token) <= clock.slack
    with pytest.raises(RateLimited) as again:
        second.get("slow").call(lambda: calls.append("f"))
    assert again.value.until == parked.value.until  # a refusal takes no token
    clock.advance((parked.value.until - clock() + clock.slack).total_seconds())
    first.get("slow").call(lambda: calls.append("g"))
    assert calls == ["a", "b", "c", "d", "g"]


def test_a_rate_check_is_one_round_trip_on_the_server(mongo_uri: str, mongo_db: Any) -> None:
    from eventbus.store.mongo import MongoEventStore

    settings = mongo_settings(mongo_uri, mongo_db.name, partner_rate=1.0,
                              partner_rate_wait_seconds=0.1)
    counted = MongoEventStore.from_settings(settings, count_round_trips=True)
    try:
        counted.now()  # the server clock's first reading (then every few minutes)
        group, limit = Partners.beside(counted, settings), RateLimit(1000, 1)
        with counted.round_trips.measure() as first:
            beside(counted).rate_take("acme", limit, NO_WAIT)  # the bucket's upsert
        with counted.round_trips.measure() as refused:
            beside(counted).rate_take("acme", limit, NO_WAIT)
        with counted.round_trips.measure() as call, pytest.raises(RateLimited):
            group.get("acme").call(lambda: None)
        assert first.commands == refused.commands == ["findAndModify"]
        assert call.commands == ["find", "findAndModify"]  # the breaker's read, the rate's take
    finally:
        counted.close()


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
        assert record["parks"] == partner_documents.parks(record) == 1  # counted beside the error
        assert partner_documents.is_parked(record)
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


def test_reset_forgets_the_breakers_too(store: EventStore, clock: StoreTime) -> None:
    fail(partners(store, clock))
    store.reset()
    assert beside(store).breaker_get("acme") is None and beside(store).breakers() == []


def test_a_probe_that_closes_the_breaker_brings_its_parked_events_back(
        store: EventStore, clock: StoreTime) -> None:
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
