"""Replay and the dead-letter drain on the store alone: ordering, races and failures."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.errors import StoreUnavailable
from eventbus.model.keys import canonical_json
from eventbus.ops.replay import Replayer, routerless, spaced
from eventbus.pubsub.message import build_event, build_message
from eventbus.testing import CapturingPublisher
from eventbus.workers import deadletter
from tests.ops.conftest import Bus


class FakeDeadLetters:
    subscription = "projects/local-project/subscriptions/partner-events-dlq-pull"

    def __init__(self, messages: list[deadletter.Pulled]) -> None:
        self.waiting, self.acked = list(messages), []  # type: list[deadletter.Pulled], list[str]

    def pull(self, max_messages: int) -> Sequence[deadletter.Pulled]:
        taken, self.waiting = self.waiting[:max_messages], self.waiting[max_messages:]
        return taken

    def ack(self, ack_ids: Sequence[str]) -> None:
        self.acked.extend(ack_ids)


def pulled(n: int, tag: str) -> deadletter.Pulled:
    event = build_event("OR_MGMT", {"tag": tag}, entity={"partnerId": "p-1", "entity_id": tag,
                                                          "entity_type": "Order"})
    data, attributes = build_message(event, key=tag)
    return deadletter.Pulled(f"ack-{n}", Delivery(data, attributes, message_id=f"dl-{n}",
                                           subscription=FakeDeadLetters.subscription))


class FlakyStore:
    """The real store, unreachable from the ``fail_at``-th dead-letter write on."""

    def __init__(self, store: Any, fail_at: int) -> None:
        self.store, self.fail_at, self.writes = store, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def store_dead_letter(self, *args: Any, **kwargs: Any) -> str:
        self.writes += 1
        if self.writes >= self.fail_at:
            raise StoreUnavailable("connection refused")
        result: str = self.store.store_dead_letter(*args, **kwargs)
        return result


def test_a_message_is_acked_only_after_its_write(bus: Bus) -> None:
    source = FakeDeadLetters([pulled(n, f"t{n}") for n in range(5)])
    flaky = FlakyStore(bus.store, fail_at=4)
    report = deadletter.drain(flaky, source, routerless(bus.store), bus.clock, batch=2)
    assert (report.pulled, report.stored, report.acked) == (4, 3, 3)
    assert source.acked == ["ack-0", "ack-1", "ack-2"] and "store unavailable" in report.error
    again = deadletter.drain(bus.store, source, routerless(bus.store), bus.clock, batch=2)
    assert again.pulled == 1 and again.error == ""  # the fifth; the fourth comes back later


def test_drain_respects_its_limit(bus: Bus) -> None:
    source = FakeDeadLetters([pulled(n, f"l{n}") for n in range(5)])
    report = deadletter.drain(bus.store, source, routerless(bus.store), bus.clock, batch=2, limit=3)
    assert (report.pulled, report.acked, len(source.waiting)) == (3, 3, 2)


def test_a_replay_racing_a_delivery_is_skipped_and_changes_nothing(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="race").key
    record = bus.store.get(key)
    bus.store.record_replay(key, {"by": "other"}, bus.clock(), reopen=True)
    claimed = bus.store.claim(key, {}, bus.clock())  # a delivery holds it now
    publisher = CapturingPublisher()
    replayer = Replayer(bus.store, publisher, bus.clock, by="me", why="race",
                        locate=routerless(bus.store))
    result = replayer.replay(record)
    assert result.outcome == "skipped" and "PROCESSING" in result.detail
    assert publisher.messages == []
    assert bus.store.get(key)["lease_owner"] == claimed.owner


def test_a_failed_publish_leaves_the_record_reopened(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="down").key
    publisher = CapturingPublisher(failures=1)
    replayer = Replayer(bus.store, publisher, bus.clock, by="me", why="x",
                        locate=routerless(bus.store))
    result = replayer.replay(bus.store.get(key))
    assert result.outcome == "failed" and "not published" in result.detail
    assert bus.store.get(key)["retryable"] is True


def test_a_record_that_would_land_elsewhere_is_not_replayed(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=1, tag="moved").key
    record = bus.store.get(key)
    record["pubsub"]["attributes"]["idempotency_key"] = "another"
    replayer = Replayer(bus.store, CapturingPublisher(), bus.clock, by="me", why="x",
                        locate=routerless(bus.store))
    result = replayer.replay(record)
    assert result.outcome == "skipped" and "not under its own key" in result.detail
    assert "replays" not in bus.store.get(key)


def test_the_rate_limit_spaces_calls() -> None:
    now, slept = [0.0], []  # type: list[float], list[float]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limit = spaced(4.0, sleep=sleep, monotonic=lambda: now[0])
    for _ in range(3):
        limit.wait()
    assert slept == [0.25, 0.25]
    spaced(None, sleep=sleep).wait()
    assert len(slept) == 2


def test_a_replayed_message_is_the_stored_event_with_its_attributes(bus: Bus) -> None:
    key = bus.deliver(mode="permanent", orderId=5, tag="same").key
    record = bus.store.get(key)
    publisher = CapturingPublisher()
    Replayer(bus.store, publisher, bus.clock, by="me", why="x",
             locate=routerless(bus.store)).replay(record)
    (message,) = publisher.messages
    from eventbus.model.event import event_from_document

    assert message.data == canonical_json(event_from_document(record).to_document()).encode()
    assert dict(message.attributes) == record["pubsub"]["attributes"]
    assert dt.datetime.fromisoformat(str(bus.store.get(key)["replays"][0]["at"])) is not None
