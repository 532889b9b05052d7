"""The outbox relay on the in-memory store: marking, retries, the budget and the sweeper.

Time is fake: ``FakeTime`` is the clock, the monotonic clock and ``sleep``,
so backoff and budgets are checked without waiting. The relay uses only the
store's outbox primitives; the outbox is read back with ``store.get(parent)``.

That the sweep's MongoDB query is pinned to the outbox index is a property of
``MemoryEventStore``, not of the relay: it is covered by the contract tests
(``tests/contract``), not here.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from eventbus.model.context import Child
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import child_key
from eventbus.outbox.relay import Backoff, Relay, ordered_chains
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher

META = EntityMetadata("p1", "order-1", "Order", "Partner One")


class FakeTime:
    """Wall clock, monotonic clock and sleep in one; sleeping moves both."""

    def __init__(self) -> None:
        self.moment = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
        self.ticks = 0.0
        self.sleeps: list[float] = []

    def now(self) -> dt.datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.ticks

    def advance(self, seconds: float) -> None:
        self.moment += dt.timedelta(seconds=seconds)
        self.ticks += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


@pytest.fixture()
def store() -> MemoryEventStore:
    return MemoryEventStore(created_by="test", retention=dt.timedelta(days=1),
                            lease=dt.timedelta(seconds=30))


def committed(store: MemoryEventStore, time: FakeTime, parent: str = "parent",
              children: int = 2, ordering_key: str = "",
              corrupt: str = "") -> list[dict[str, Any]]:
    """Store ``parent`` as SUCCESS with ``children`` PENDING outbox entries; return them.

    ``corrupt`` names a field the stored entries lose (a damaged document).
    """
    claim = store.claim(parent, {"event_type": "TEST"}, time.now())
    outbox = [Child(child_key(parent, "CHILD", n),
                    Event("CHILD", "v1", "OUT", META, {"n": n}), ordering_key)
              .to_document(parent, "root", time.now()) for n in range(children)]
    for entry in outbox:
        entry.pop(corrupt, None)
    assert store.succeed(parent, claim.owner, time.now(), outbox)
    return outbox


def relay_for(store: MemoryEventStore, publisher: CapturingPublisher, time: FakeTime,
              **options: Any) -> Relay:
    return Relay(store, publisher, now=time.now, sleep=time.sleep,
                 jitter=lambda: 0.5, monotonic=time.monotonic, **options)


def test_pending_children_are_published_and_marked(store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher()
    outbox = committed(store, time, ordering_key="order-1")
    report = relay_for(store, publisher, time).relay("parent", outbox)
    assert (report.published, report.failed, report.deferred) == (2, 0, 0)
    first = publisher.messages[0]
    assert first.attributes == {"event_type": "CHILD", "event_version": "v1",
                                "idempotency_key": "parent/0:CHILD", "parent_key": "parent",
                                "root_key": "root"}
    assert first.ordering_key == "order-1" and first.timeout is None
    entries = store.get("parent")["outbox"]
    assert [e["status"] for e in entries] == ["PUBLISHED", "PUBLISHED"]
    assert [e["messageId"] for e in entries] == ["msg-1", "msg-2"]
    assert entries[0]["published_at"] == time.now() and entries[0]["publish_attempts"] == 1


def test_an_entry_already_published_is_neither_published_nor_marked_again(
        store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher()
    outbox = committed(store, time)
    relay = relay_for(store, publisher, time)
    relay.relay("parent", outbox)
    again = relay.relay("parent", store.get("parent")["outbox"])
    assert again.published == 0 and len(publisher.messages) == 2
    # A stale copy of the outbox (another relay's) publishes again, but never re-marks.
    stale = relay.relay("parent", outbox)
    assert stale.published == 2 and len(publisher.messages) == 4
    assert [e["messageId"] for e in store.get("parent")["outbox"]] == ["msg-1", "msg-2"]


def test_publishing_retries_at_once_then_with_exponential_jittered_backoff(
        store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher(failures=3)
    outbox = committed(store, time, children=1)
    report = relay_for(store, publisher, time,
                       backoff=Backoff(tries=4, base=0.1, cap=2.0)).relay("parent", outbox)
    assert report.published == 1 and publisher.tries == 4
    assert time.sleeps == [0.0, 0.5 * 0.1, 0.5 * 0.2]
    assert store.get("parent")["outbox"][0]["publish_attempts"] == 4


def test_backoff_is_capped() -> None:
    backoff = Backoff(tries=10, base=0.1, cap=0.3)
    assert [backoff.delay(n, 1.0) for n in range(1, 6)] == [0.0, 0.1, 0.2, 0.3, 0.3]


def test_an_entry_that_cannot_be_published_stays_pending_with_its_error(
        store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher(failures=100)
    outbox = committed(store, time, children=1)
    report = relay_for(store, publisher, time, backoff=Backoff(tries=3)).relay("parent", outbox)
    assert (report.published, report.failed) == (0, 1)
    (entry,) = store.get("parent")["outbox"]
    assert entry["status"] == "PENDING" and entry["publish_attempts"] == 3
    assert entry["last_error"]["type"] == "PublishError"
    assert entry["last_attempt_at"] == time.now()


def test_the_inline_budget_bounds_the_delay_and_leaves_the_rest_to_the_sweeper(
        store: MemoryEventStore) -> None:
    time = FakeTime()
    # Each publish takes 0.8 s; the budget is 2 s: two entries fit, the third waits.
    publisher = CapturingPublisher(on_publish=lambda: time.advance(0.8))
    outbox = committed(store, time, children=4)
    report = relay_for(store, publisher, time, budget=2.0).relay("parent", outbox, budget=2.0)
    assert (report.published, report.deferred) == (3, 1)
    assert time.ticks <= 2.0 + 0.8  # at most one publish started inside the budget runs over
    timeouts = [m.timeout for m in publisher.messages]
    assert timeouts == pytest.approx([2.0, 1.2, 0.4])
    statuses = [e["status"] for e in store.get("parent")["outbox"]]
    assert statuses == ["PUBLISHED", "PUBLISHED", "PUBLISHED", "PENDING"]


def test_no_retry_sleeps_past_the_budget(store: MemoryEventStore) -> None:
    time = FakeTime()
    publisher = CapturingPublisher(failures=100, on_publish=lambda: time.advance(0.5))
    outbox = committed(store, time, children=1)
    relay = relay_for(store, publisher, time, backoff=Backoff(tries=10, base=1.0, cap=8.0))
    report = relay.relay("parent", outbox, budget=2.0)
    assert report.failed == 1 and time.ticks <= 2.0


def test_the_hook_uses_the_configured_budget_and_never_raises(store: MemoryEventStore) -> None:
    time = FakeTime()
    publisher = CapturingPublisher(on_publish=lambda: time.advance(1.5))
    outbox = committed(store, time, children=3)
    relay_for(store, publisher, time, budget=1.0)("parent", outbox)
    assert len(publisher.messages) == 1
    relay_for(store, publisher, time, budget=1.0)("no-such-parent", [{"status": "PENDING"}])


def test_the_sweeper_publishes_what_a_crash_left_after_the_grace_period(
        store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher()
    committed(store, time, parent="crashed")  # SUCCESS stored, then the process died
    relay = relay_for(store, publisher, time)
    grace = dt.timedelta(seconds=30)
    assert relay.sweep(grace).published == 0  # too young: the inline relay may still run
    time.advance(31)
    committed(store, time, parent="young")
    report = relay.sweep(grace)
    assert report.published == 2
    assert {m.attributes["parent_key"] for m in publisher.messages} == {"crashed"}
    assert relay.sweep(grace).published == 0
    assert {e.parent_key for e in store.pending_outbox(time.now())} == {"young"}


def test_a_corrupted_entry_is_recorded_and_does_not_stop_the_sweep(store: MemoryEventStore) -> None:
    time, publisher = FakeTime(), CapturingPublisher()
    # The relay serialises a stored entry without validating it again (it was validated
    # when emitted), so the damage it can meet is an entry that lost a field.
    committed(store, time, parent="broken", children=1, corrupt="event_type")
    committed(store, time, parent="fine", children=1)
    report = relay_for(store, publisher, time).sweep(dt.timedelta(0))
    assert (report.published, report.failed) == (1, 1) and publisher.tries == 1
    (entry,) = store.get("broken")["outbox"]
    assert entry["status"] == "PENDING" and entry["last_error"]["type"] == "InvalidEvent"


def outbox_of(parent: str, *keys: str) -> tuple[str, list[dict[str, Any]]]:
    """A parent's outbox as the processor hands it over: one PENDING child per ordering key."""
    return parent, [{"status": "PENDING", "ordering_key": key} for key in keys]


def test_parents_whose_children_share_an_ordering_key_form_one_chain_in_order() -> None:
    a, b, c, d, e = (outbox_of("a", "k1"), outbox_of("b", ""), outbox_of("c", "k2"),
                     outbox_of("d", "k2", "k1"), outbox_of("e", "k3"))
    chains = ordered_chains([a, b, c, d, e])
    # d links k1 (a's) and k2 (c's): a, c and d are one chain, in the batch's order.
    assert [[parent for parent, _ in chain] for chain in chains] == [["a", "c", "d"], ["b"],
                                                                      ["e"]]
    published = ("x", [{"status": "PUBLISHED", "ordering_key": "k1"}])
    assert len(ordered_chains([a, published])) == 2  # only pending children order a parent


def test_relay_many_relays_parents_side_by_side(store: MemoryEventStore) -> None:
    time = FakeTime()
    both_publishing = threading.Barrier(2, timeout=10)
    # Each publish waits until the other parent's publishes too: only parents relayed
    # at once get past it (one after another, the barrier breaks and nothing is published).
    publisher = CapturingPublisher(on_publish=both_publishing.wait)
    outboxes = [(parent, committed(store, time, parent, children=1)) for parent in ("p", "q")]
    relay = relay_for(store, publisher, time, parallel=2)
    try:
        relay.relay_many(outboxes)
    finally:
        relay.close()
    assert sorted(m.attributes["parent_key"] for m in publisher.messages) == ["p", "q"]
    for parent, _ in outboxes:
        assert [e["status"] for e in store.get(parent)["outbox"]] == ["PUBLISHED"]


def test_relay_many_keeps_an_ordering_key_in_the_batch_order(store: MemoryEventStore) -> None:
    time = FakeTime()
    second_published = threading.Event()

    def publishing() -> None:
        # The first parent's child waits a little for the second's: were the two parents
        # relayed side by side, the second's child would go out first.
        if not publisher.messages:
            second_published.wait(0.2)
        else:
            second_published.set()

    publisher = CapturingPublisher(on_publish=publishing)
    outboxes = [(parent, committed(store, time, parent, children=1, ordering_key="order-1"))
                for parent in ("first", "second")]
    relay = relay_for(store, publisher, time, parallel=4)
    try:
        relay.relay_many(outboxes)
    finally:
        relay.close()
    assert [m.attributes["parent_key"] for m in publisher.messages] == ["first", "second"]


def test_relay_many_in_turn_with_parallel_one_and_never_raises(store: MemoryEventStore) -> None:
    time = FakeTime()
    publisher = CapturingPublisher(failures=100)
    outboxes = [(parent, committed(store, time, parent, children=1)) for parent in ("p", "q")]
    relay_for(store, publisher, time).relay_many(outboxes)  # every try fails: logged only
    assert publisher.tries == 2 * Backoff().tries
    for parent, _ in outboxes:
        assert [e["status"] for e in store.get(parent)["outbox"]] == ["PENDING"]
