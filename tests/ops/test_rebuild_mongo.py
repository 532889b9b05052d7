"""``eventbus rebuild`` on the real server: ``--emit-new``, ``--forward`` and ordered entities.

The router here is the app the command loads (``--app tests.ops.test_rebuild_mongo:cascade``):
a parent that emits ``CHILDREN["count"]`` internal steps and is forwarded to a public
topic, and an ordered handler that records the positions it sees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest

from eventbus import Context, Router, contract
from eventbus.model.delivery import Delivery
from eventbus.model.forward import is_forward
from eventbus.outbox.relay import Relay
from eventbus.processor import Processor, Result
from eventbus.pubsub.message import build_event, build_message
from tests.ops.conftest import Bus

APP = "tests.ops.test_rebuild_mongo:cascade"
CHILDREN = {"count": 1}
SEEN: list[tuple[int, bool]] = []
ENTITY = {"partnerId": "p-1", "entity_id": "order-7", "entity_type": "Order"}


@contract("order-total", "v1")
@dataclasses.dataclass(frozen=True)
class Total:
    """The public shape of an order's total."""

    order_id: str
    total: int


cascade = Router()
cascade.forward("CASCADE_ORDER", topic="order-total", contract=Total,
                fields={"order_id": "entity_metadata.entity_id", "total": "entity_data.total"})


@cascade.handler("CASCADE_ORDER")
def order(context: Context) -> None:
    """Emit ``CHILDREN["count"]`` steps (the fixed code emits more)."""
    for index in range(CHILDREN["count"]):
        context.emit("CASCADE_STEP", {"i": index})


@cascade.handler("CASCADE_STEP", internal=True)
def step(context: Context) -> None:
    """A step of the cascade: nothing to do."""


@cascade.handler("CASCADE_POS", ordered_by="entity_data.ts")
def position(context: Context) -> None:
    """Record the position seen, and whether in replay mode."""
    SEEN.append((context.event.entity_data["ts"], context.replay is not None))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CHILDREN["count"] = 1
    SEEN.clear()


def live(bus: Bus, event_type: str, data: dict[str, Any], number: int) -> Result:
    """Process one message live, its outbox relayed to the capturing publisher."""
    body, attributes = build_message(build_event(event_type, data, entity=ENTITY))
    processor = Processor(bus.store, cascade, bus.settings, bus.clock,
                          after_success=Relay(bus.store, bus.publisher, now=bus.store.now))
    with contextlib.closing(processor):
        result = processor.process(Delivery(body, attributes, message_id=f"live-{number}"))
    bus.clock.advance(1)
    return result


def test_new_children_are_published_only_with_emit_new_and_only_once(bus: Bus) -> None:
    key = live(bus, "CASCADE_ORDER", {"total": 5}, 1).key
    assert len(bus.publisher.take()) == 2  # the step and the forward, live
    CHILDREN["count"] = 3  # the fixed code emits two more steps
    report = bus.json("rebuild", "--type", "CASCADE_ORDER", "--app", APP)
    assert [c["key"] for c in report["new_children"]] == [f"{key}/1:CASCADE_STEP",
                                                          f"{key}/2:CASCADE_STEP"]
    assert not any(c["emitted"] for c in report["new_children"])
    assert bus.publisher.take() == []
    assert len((bus.store.get(key) or {})["outbox"]) == 2
    emitted = bus.json("rebuild", "--type", "CASCADE_ORDER", "--app", APP, "--emit-new")
    assert all(c["emitted"] for c in emitted["new_children"])
    sent = bus.publisher.take()
    assert sorted(m.attributes["idempotency_key"] for m in sent) == \
        [f"{key}/1:CASCADE_STEP", f"{key}/2:CASCADE_STEP"]
    assert all(m.topic != "order-total" for m in sent)  # no forward without --forward
    record = bus.store.get(key) or {}
    assert [entry["status"] for entry in record["outbox"]] == ["PUBLISHED"] * 4
    again = bus.json("rebuild", "--type", "CASCADE_ORDER", "--app", APP, "--emit-new")
    assert again["new_children"] == [] and bus.publisher.take() == []
    assert len((bus.store.get(key) or {})["replays"]) == 3


def test_forwards_are_published_again_only_with_forward(bus: Bus) -> None:
    key = live(bus, "CASCADE_ORDER", {"total": 5}, 1).key
    [forwarded] = [m for m in bus.publisher.take() if m.topic == "order-total"]
    report = bus.json("rebuild", "--type", "CASCADE_ORDER", "--app", APP)
    assert report["counts"]["rebuilt"] == 1 and bus.publisher.take() == []
    bus.json("rebuild", "--type", "CASCADE_ORDER", "--app", APP, "--forward")
    [again] = bus.publisher.take()
    assert again.topic == "order-total" and json.loads(again.data) == json.loads(forwarded.data)
    assert again.attributes["idempotency_key"] == forwarded.attributes["idempotency_key"]
    record = bus.store.get(key) or {}
    assert len(record["outbox"]) == 2  # the forward entry is the same one, not a second
    [entry] = [entry for entry in record["outbox"] if is_forward(entry)]
    assert record["replays"][-1]["forwarded"] == [entry["idempotency_key"]]
    assert record["replays"][0]["forwarded"] == []


def test_an_ordered_entity_is_rebuilt_in_position_order_and_its_position_stays(
        bus: Bus) -> None:
    keys = {ts: live(bus, "CASCADE_POS", {"ts": ts}, ts).key for ts in (1, 3)}
    stale = live(bus, "CASCADE_POS", {"ts": 2}, 2)  # older than 3: stored stale, never ran
    assert stale.outcome.value == "stale" and SEEN == [(1, False), (3, False)]
    record = bus.store.get(keys[3]) or {}
    entity_key = record["order"]["entity_key"]
    before = bus.store.get(entity_key) or {}
    report = bus.json("rebuild", "--type", "CASCADE_POS", "--app", APP, "--batch", "2")
    assert SEEN[2:] == [(1, True), (3, True)]
    assert report["counts"]["rebuilt"] == 2 and report["counts"]["skipped"] == 1
    assert "stale" in report["skipped"][0]["reason"]
    after = bus.store.get(entity_key) or {}
    assert after["position"] == before["position"] == 3  # never moved backwards
    assert after["applied_key"] == before["applied_key"] == keys[3]
    assert after.get("holder") is None  # the rebuild's holds were released
    for key in keys.values():
        stored = bus.store.get(key) or {}
        assert stored["event_status"] == "SUCCESS" and "rebuild_lease" not in stored
