"""Position kinds (issue 39, fault 8): a number and an RFC 3339 time are never ordered together.

A careless publisher sends one event of an entity with ``statusAt:
1764590000`` (epoch seconds, 2025) and the next with
``"2020-01-01T00:00:00Z"``. A time's position is its epoch microseconds, so
compared as numbers the 2020 event would win, overwrite the projection, and
leave every later numeric event (a 2027 ``DELIVERED``) silently stale. The
entity stores its applied position's kind beside it; an event of the other
kind is stored FAILED for good, acked, with an error naming both kinds, and
listed by ``eventbus failed``.

Every push goes through the Flask app (so never a 500), on both stores: the
memory store and the MongoDB-compatible local server.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventbus.clock import Shift
from eventbus.model.context import Context
from eventbus.model.order import OrderError, entity_key, position
from eventbus.model.router import Router
from eventbus.ops import cli
from eventbus.ops.reports import failed_groups, failed_query
from eventbus.settings import Settings
from eventbus.store.base import EntityRelease, EntityTake, EventStore
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from eventbus.web.app import create_app
from tests.hypothesis_profiles import examples

PARTNER = "p-kinds"
SECONDS_2025 = 1764590000
TIME_2020 = "2020-01-01T00:00:00Z"
SECONDS_2027 = 1830000000
NUMBER, TIME = "number", "time"
"""The kinds the entity record stores (``position_kind``), spelled here as stored."""


@dataclasses.dataclass
class Bus:
    """One app over one store; ``seen`` is every (entity, position value) its handler ran."""

    store: EventStore
    client: Any
    seen: list[tuple[str, Any]]

    def push(self, entity_id: str, value: Any, key: str) -> tuple[int, str]:
        """Push one status event of ``entity_id`` at ``value``; (HTTP status, stored key)."""
        body = {"event_type": "OR_MGMT", "event_version": "v1",
                "entity_metadata": {"partnerId": PARTNER, "partnerName": "Kinds",
                                    "entity_id": entity_id, "entity_type": "Order"},
                "entity_data": {"statusAt": value}}
        # ensure_ascii: a lone surrogate travels as JSON's own \\ud800 escape.
        data = json.dumps(body, ensure_ascii=True).encode()
        wrapped = {"message": {"data": base64.b64encode(data).decode(), "messageId": key,
                               "attributes": {"idempotency_key": key}},
                   "subscription": "projects/p/subscriptions/s"}
        answer = self.client.post("/", json=wrapped)
        # A value no store can hold (past 64 bits, a lone surrogate) is kept under an
        # ``invalid:`` key of its own: the answer names where it went.
        stored = (answer.get_json(silent=True) or {}).get("idempotency_key")
        return answer.status_code, str(stored or f"p:{PARTNER}:{key}")


@pytest.fixture(params=["memory", "mongo"])
def store(request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """Each store in turn: the memory store, and MongoDB on the local server."""
    if request.param == "memory":
        yield MemoryEventStore(lease=dt.timedelta(seconds=20), clock=FakeClock(_now()))
        return
    from eventbus.store.mongo import MongoEventStore

    database = request.getfixturevalue("mongo_db")
    built = MongoEventStore.from_settings(
        Settings(mongodb_uri=request.getfixturevalue("mongo_uri"), mongodb_db=database.name),
        shift=Shift())
    built.ensure_indexes()
    yield built
    built.close()


@pytest.fixture()
def bus(store: EventStore) -> Iterator[Bus]:
    """The app of one ordered route (``ordered_by="entity_data.statusAt"``) over ``store``."""
    seen: list[tuple[str, Any]] = []
    routes = Router()

    @routes.handler("OR_MGMT", ordered_by="entity_data.statusAt")
    def project(context: Context) -> None:
        seen.append((context.event.entity_metadata.entity_id,
                     context.event.entity_data["statusAt"]))

    app = create_app(routes, Settings(relay_inline=False, max_attempts=3), store,
                     now=FakeClock(_now()))
    yield Bus(store, app.test_client(), seen)
    app.extensions["eventbus"].processor.close(grace=0)


def _now() -> dt.datetime:
    # Real time: the MongoDB TTL index would remove records created in the past.
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _fresh() -> str:
    return f"o-{uuid.uuid4().hex[:10]}"


# -- the case ------------------------------------------------------------------------

def test_a_time_after_a_number_is_a_stored_failure_and_the_number_order_goes_on(
        bus: Bus) -> None:
    entity = _fresh()
    assert bus.push(entity, SECONDS_2025, "placed")[0] < 300
    status, mixed = bus.push(entity, TIME_2020, "mixed")
    assert 200 <= status < 300  # acked: no retry can make it comparable
    record = bus.store.get(mixed) or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is False
    message = record["error"]["message"]
    assert record["error"]["type"] == "PositionKindMismatch"
    assert "an RFC 3339 time" in message and "a number" in message
    assert "2020-01-01T00:00:00Z" in message and str(SECONDS_2025) in message
    # The projection never moved to 2020; the 2027 delivery still runs.
    assert bus.push(entity, SECONDS_2027, "delivered")[0] < 300
    assert bus.seen == [(entity, SECONDS_2025), (entity, SECONDS_2027)]
    applied = bus.store.get(entity_key(PARTNER, "Order", entity)) or {}
    assert (applied["position"], applied["position_kind"]) == (SECONDS_2027, NUMBER)
    assert (bus.store.get(f"p:{PARTNER}:delivered") or {}).get("stale") is None


def test_a_number_after_a_time_is_refused_too(bus: Bus) -> None:
    entity = _fresh()
    bus.push(entity, "2026-11-25T12:00:00+01:00", "first")
    bus.push(entity, SECONDS_2027, "second")
    record = bus.store.get(f"p:{PARTNER}:second") or {}
    assert record["event_status"] == "FAILED" and record["retryable"] is False
    assert "is a number" in record["error"]["message"]
    assert "2026-11-25T11:00:00Z" in record["error"]["message"]  # the time, not microseconds
    assert bus.seen == [(entity, "2026-11-25T12:00:00+01:00")]


def test_the_refusal_is_listed_by_eventbus_failed(bus: Bus,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    entity = _fresh()
    bus.push(entity, SECONDS_2025, "placed")
    bus.push(entity, TIME_2020, "mixed")
    out = io.StringIO()
    monkeypatch.setenv("EVENTBUS_OPERATOR", "ops@example.com")
    monkeypatch.setattr(cli, "open_store", lambda _settings: bus.store)
    monkeypatch.setattr("sys.stdout", out)
    assert cli.main(["failed", "--json"]) == 0
    text = out.getvalue()
    assert "PositionKindMismatch" in text and f"p:{PARTNER}:mixed" in text


def test_one_batch_of_both_kinds_applies_one_kind_and_refuses_the_other(store: EventStore) -> None:
    # A batch's lane for a new entity: one kind's events in order, then the other's refused.
    from eventbus.model.delivery import Delivery
    from eventbus.processor import Processor

    seen: list[Any] = []
    routes = Router()

    @routes.handler("OR_MGMT", ordered_by="entity_data.statusAt")
    def project(context: Context) -> None:
        seen.append(context.event.entity_data["statusAt"])

    processor = Processor(store, routes, Settings(max_attempts=3), FakeClock(_now()))
    entity = _fresh()

    def delivery(value: Any, key: str) -> Delivery:
        body = {"event_type": "OR_MGMT", "event_version": "v1",
                "entity_metadata": {"partnerId": PARTNER, "entity_id": entity,
                                    "entity_type": "Order"},
                "entity_data": {"statusAt": value}}
        return Delivery(json.dumps(body).encode(), {"idempotency_key": key}, message_id=key)

    try:
        results = processor.run([delivery(TIME_2020, "t"), delivery(SECONDS_2027, "b"),
                                 delivery(SECONDS_2025, "a")])
    finally:
        processor.close(grace=0)
    assert [r.outcome.value for r in results] == ["rejected", "processed", "processed"]
    assert seen == [SECONDS_2025, SECONDS_2027]
    assert (store.get(f"p:{PARTNER}:t") or {})["error"]["type"] == "PositionKindMismatch"


# -- the stores refuse a kind mismatch themselves --------------------------------------------

def test_a_release_never_moves_a_position_over_one_of_another_kind(store: EventStore) -> None:
    key = entity_key(PARTNER, "Order", _fresh())
    entity = {"partnerId": PARTNER, "entity_type": "Order", "entity_id": "x"}
    now = _now()
    held = store.take_entities({key: EntityTake(entity, ("k1",), (SECONDS_2025,), NUMBER)}, now)
    store.finish_many([], now, [EntityRelease(key, held.owner, SECONDS_2025, "k1", kind=NUMBER)])
    # A time's microseconds are "ahead" of any epoch second: refused by the store's own rule.
    again = store.take_entities({key: EntityTake(entity, ("k2",), (position(TIME_2020),), TIME)},
                                now)
    assert again.held(key) and again.records[key]["position_kind"] == NUMBER
    store.finish_many([], now, [EntityRelease(key, again.owner, position(TIME_2020), "k2",
                                              kind=TIME)])
    record = store.get(key) or {}
    assert (record["position"], record["position_kind"], record["applied_key"]) == \
        (SECONDS_2025, NUMBER, "k1")


def test_a_claim_holds_a_tagged_entity_only_for_a_take_of_its_kind(store: EventStore) -> None:
    # The claim's cheap hold hides the applied position from the lane: it must be one the
    # take compares with, else the lane would run a mismatched event as if the entity were new.
    key = entity_key(PARTNER, "Order", _fresh())
    entity = {"partnerId": PARTNER, "entity_type": "Order", "entity_id": "x"}
    now = _now()
    held = store.take_entities({key: EntityTake(entity, ("k1",), (5,), NUMBER)}, now)
    store.finish_many([], now, [EntityRelease(key, held.owner, 5, "k1", kind=NUMBER)])
    fields = {"event_type": "OR_MGMT", "partnerId": PARTNER}
    batch = store.claim_many({"p:k9": fields}, now,
                             {key: EntityTake(entity, ("p:k9",), (position(TIME_2020),), TIME)})
    assert batch.holds is not None and not batch.holds.held(key)
    batch = store.claim_many({"p:k10": fields}, now,
                             {key: EntityTake(entity, ("p:k10",), (7,), NUMBER)})
    assert batch.holds is not None and batch.holds.held(key)


def test_an_entity_stored_before_kinds_compares_as_before_and_is_tagged_then(
        bus: Bus) -> None:
    entity = _fresh()
    bus.push(entity, 100, "old")
    record_key = entity_key(PARTNER, "Order", entity)
    _untag(bus.store, record_key)
    assert bus.push(entity, 50, "older")[0] < 300
    assert (bus.store.get(f"p:{PARTNER}:older") or {}).get("stale") is not None
    bus.push(entity, 200, "newer")
    record = bus.store.get(record_key) or {}
    assert (record["position"], record["position_kind"]) == (200, NUMBER)
    assert bus.seen == [(entity, 100), (entity, 200)]


def _untag(store: EventStore, key: str) -> None:
    # What an entity record written before kinds were looks like: no position_kind.
    if isinstance(store, MemoryEventStore):
        store._events[key].pop("position_kind", None)
    else:
        store._collection.update_one(  # type: ignore[attr-defined]
            {"idempotency_key": key}, {"$unset": {"position_kind": ""}})


# -- hostile values, mixed on one entity -----------------------------------------------------

_WHEN = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31),
                     timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5)),
                                                dt.timezone(dt.timedelta(hours=-9,
                                                                         minutes=-30))]))
HOSTILE = st.one_of(
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    st.integers(),  # past 64 bits too
    st.sampled_from([2**63, -(2**63), 2**64, 10**30, 0, -1, SECONDS_2025, SECONDS_2027]),
    st.floats(),  # NaN and infinities included
    st.booleans(), st.none(),
    st.integers().map(str), st.floats(allow_nan=False).map(repr),
    _WHEN.map(lambda moment: moment.isoformat()),
    _WHEN.map(lambda moment: moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")),
    st.sampled_from([TIME_2020, "2026-11-25T12:00:00+01:00", "2026-13-45T99:00:00Z",
                     "2026-11-25 12:00:00", "2026-11-25T12:00:00.123456789z", "now", "",
                     "\ud800", "a\x00b", "2026-11-25T12:00:00Z\x00", "١٢٣"]),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=12),
)


@dataclasses.dataclass
class Model:
    """What the entity must say after each push: its applied position and kind, or none."""

    position: int | float | None = None
    kind: str = ""

    def expect(self, value: Any) -> str:
        """The one allowed outcome of ``value``: applied, stale, invalid or mismatch."""
        try:
            read = position(value, "statusAt")
            kind = TIME if isinstance(value, str) else NUMBER
        except OrderError:
            return "invalid"
        if self.position is not None and kind != self.kind:
            return "mismatch"
        if self.position is not None and read < self.position:
            return "stale"
        self.position, self.kind = read, kind
        return "applied"


def _check(bus: Bus, values: list[Any]) -> None:
    entity, model, applied, refused = _fresh(), Model(), [], set()
    for index, value in enumerate(values):
        status, key = bus.push(entity, value, f"{entity}-{index}")
        expected = model.expect(value)
        assert 200 <= status < 300, (value, status)  # always acked, never a 500 or a 503
        record = bus.store.get(key) or {}
        if expected == "applied":
            applied.append((entity, value))
            assert record["event_status"] == "SUCCESS" and not record.get("stale"), value
        elif expected == "stale":
            assert record["event_status"] == "SUCCESS" and record.get("stale"), value
        else:
            assert record["event_status"] == "FAILED" and record["retryable"] is False, value
            refused.add(key)
            if expected == "mismatch":
                assert record["error"]["type"] == "PositionKindMismatch", record["error"]
                assert "a number" in record["error"]["message"]
                assert "an RFC 3339 time" in record["error"]["message"]
    assert [seen for seen in bus.seen if seen[0] == entity] == applied  # nothing else ran
    stored = bus.store.get(entity_key(PARTNER, "Order", entity)) or {}
    assert stored.get("position") == model.position
    if model.position is not None:
        assert stored["position_kind"] == model.kind
    listed = {str(r["idempotency_key"]) for r in
              failed_groups(bus.store, failed_query()).records}
    assert refused <= listed  # every refusal is listed by ``eventbus failed``


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.lists(HOSTILE, min_size=1, max_size=6))
@example(values=[SECONDS_2025, TIME_2020, SECONDS_2027])
@example(values=[TIME_2020, SECONDS_2025, "2030-01-01T00:00:00Z", 1.5, float("nan")])
@example(values=[2**64, True, "1764590000", "\ud800", "a\x00b", 0])
def test_hostile_positions_mixing_kinds_are_applied_stale_or_a_stored_failure(
        bus: Bus, values: list[Any]) -> None:
    _check(bus, values)
