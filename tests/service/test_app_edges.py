"""The partner app at its edges (issue 10): timestamps, projection ids, partner keys and URLs.

``LocalBus`` runs the app's real router on the in-memory store, the handlers
write to mongomock and call the scripted partner server. Whatever a payload
holds, a handler either applies it or raises a ``PermanentError`` (stored
FAILED, acked): never a transient error that the broker would retry for
days, never a frozen projection, never a guard record left PROCESSING.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import mongomock
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.guard import Guard
from eventbus.model.keys import child_key
from eventbus.model.outcome import Outcome
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock, LocalBus
from handlers import create_router
from handlers.common import MAX_FUTURE_SECONDS, MAX_HISTORY, projection_id
from handlers.notifications import NOTIFY, SENT
from handlers.partners import (
    BadPartnerId,
    PartnerClient,
    PartnerUnavailable,
    idempotency_header,
    partner_url,
)
from handlers.settings import AppSettings, PartnerSettings
from tests.hypothesis_profiles import examples
from tests.partner_server import PartnerServer

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
ENTITY = {"partnerId": "p1", "partnerName": "Partner One", "entity_id": "order-1",
          "entity_type": "Order"}
TEMPLATE = "http://127.0.0.1:9/partners/{partnerId}/events"
ACKED = {Outcome.PROCESSED, Outcome.REJECTED, Outcome.DUPLICATE, Outcome.CONFLICT}


@pytest.fixture()
def partner() -> Iterator[PartnerServer]:
    with PartnerServer() as server:
        yield server


def make_bus(partner: PartnerServer) -> LocalBus:
    router = create_router(AppSettings(partners=PartnerSettings(url=partner.template)))
    return LocalBus(router, clock=FakeClock(NOW),
                    database=mongomock.MongoClient(tz_aware=True)["db"])


@pytest.fixture()
def bus(partner: PartnerServer) -> Iterator[LocalBus]:
    with make_bus(partner) as bus:
        yield bus


def order(status: str, timestamp: Any, order_id: Any = 1) -> dict[str, Any]:
    return {"orderId": order_id, "orderStatusLatest": status,
            "orderStatusLatestTimestamp": timestamp}


def raw_event(event_type: str, data_json: str, entity: dict[str, str] = ENTITY,
              version: str = "v2") -> bytes:
    """An event whose ``entity_data`` is raw JSON text (``Infinity`` and ``NaN`` included)."""
    body = json.dumps({"event_type": event_type, "event_version": version,
                       "event_direction": "IN", "entity_metadata": entity,
                       "entity_data": "@@"})
    return body.replace('"@@"', data_json).encode()


def guard_statuses(bus: LocalBus) -> list[str]:
    keys = [r.key for r in bus.results if r.event_type == NOTIFY]
    return [(bus.store.guard_get(key) or {"status": "NONE"})["status"] for key in keys]


# -- timestamps -----------------------------------------------------------------------------

FUTURE = NOW.timestamp() + MAX_FUTURE_SECONDS + 60
BAD_TIMES = ["Infinity", "-Infinity", "NaN", "1e308", "-1", "-0.5", "1655292804000",
             "1e12", str(int(FUTURE)), str(2**64), "1" + "0" * 400]


@pytest.mark.parametrize("timestamp", BAD_TIMES)
def test_an_impossible_order_timestamp_is_refused_for_good(bus: LocalBus,
                                                           timestamp: str) -> None:
    data = '{"orderId": 1, "orderStatusLatest": "OR_CNF", "orderStatusLatestTimestamp": ' \
        + timestamp + "}"
    result = bus.publish_raw(raw_event("OR_MGMT", data))
    assert result.outcome is Outcome.REJECTED
    record = bus.record(result.key)
    assert record is not None and record["event_status"] == "FAILED"
    assert record["retryable"] is False
    assert bus.store.database.order_projection.count_documents({}) == 0
    assert len(bus.results) == 1  # nothing emitted


@pytest.mark.parametrize(("event_type", "data"), [
    ("SUB_MGMT", '{"subscriptionId": "s-1", "status": "ACTIVE", "updatedAt": 1e308}'),
    ("SUB_MGMT", '{"subscriptionId": "s-1", "status": "ACTIVE", "updatedAt": 1700000000000}'),
    ("PROM_MGMT", '{"promotionId": "pr-1", "discountPercent": 10, "updatedAt": -5}'),
    ("PROM_MGMT", f'{{"promotionId": "pr-1", "discountPercent": 10, "updatedAt": {FUTURE}}}'),
])
def test_impossible_timestamps_are_refused_in_every_projection(bus: LocalBus, event_type: str,
                                                               data: str) -> None:
    result = bus.publish_raw(raw_event(event_type, data, version="v1"))
    assert result.outcome is Outcome.REJECTED
    assert "updatedAt" in (bus.record(result.key) or {})["error"]["message"]


def test_a_timestamp_within_a_day_ahead_is_accepted(bus: LocalBus) -> None:
    soon = NOW.timestamp() + MAX_FUTURE_SECONDS - 60
    bus.publish("OR_MGMT", order("OR_PLC", soon), entity=ENTITY, version="v2")
    assert bus.results[-1].outcome is Outcome.PROCESSED
    assert bus.store.database.order_projection.find_one()["asOf"] == soon


def test_after_a_rejected_1e308_a_later_real_status_is_applied_and_notifies(
        bus: LocalBus, partner: PartnerServer) -> None:
    bus.publish("OR_MGMT", order("OR_PLC", 1655292800), entity=ENTITY, version="v2")
    frozen = bus.publish_raw(raw_event("OR_MGMT", json.dumps(order("OR_SHP", 1e308))))
    assert frozen.outcome is Outcome.REJECTED
    assert "finite" in (bus.record(frozen.key) or {})["error"]["message"] \
        or "milliseconds" in (bus.record(frozen.key) or {})["error"]["message"]
    root = bus.publish("OR_MGMT", order("OR_CNF", 1655292804), entity=ENTITY, version="v2")
    projection = bus.store.database.order_projection.find_one()
    assert projection["status"] == "OR_CNF" and projection["asOf"] == 1655292804
    assert projection["eventsApplied"] == 2
    (call,) = partner.calls
    assert call.body["payload"] == {"orderId": 1, "status": "OR_CNF", "asOf": 1655292804}
    assert bus.record(child_key(root, NOTIFY, 0))["event_status"] == "SUCCESS"


# -- projection ids -------------------------------------------------------------------------

def test_projection_ids_of_different_partners_and_orders_never_collide(bus: LocalBus) -> None:
    first = {**ENTITY, "partnerId": "acme:o", "entity_id": "e-1"}
    second = {**ENTITY, "partnerId": "acme", "entity_id": "e-2"}
    bus.publish("OR_MGMT", order("OR_PLC", 1655292800, order_id=1), entity=first, version="v2")
    bus.publish("OR_MGMT", order("OR_DLV", 1655292800, order_id="o:1"), entity=second,
                version="v2")
    assert [r.outcome for r in bus.results] == [Outcome.PROCESSED, Outcome.PROCESSED]
    projections = {doc["_id"]: doc for doc in bus.store.database.order_projection.find()}
    assert set(projections) == {"acme%3Ao:1", "acme:o%3A1"}
    assert projections["acme%3Ao:1"]["partnerId"] == "acme:o"
    assert projections["acme:o%3A1"]["orderId"] == "o:1"
    assert {doc["eventsApplied"] for doc in projections.values()} == {1}


def test_a_long_lived_order_keeps_a_bounded_status_history(bus: LocalBus) -> None:
    # Unbounded, every status change of an order grew its document toward the
    # store's size limit, past which no write of it could ever succeed.
    changes = MAX_HISTORY + 20
    for n in range(changes):
        bus.publish("OR_MGMT", order("OR_PLC" if n % 2 else "OR_CNF", 1655292800 + n,
                                     order_id=7), entity=ENTITY, version="v2")
    assert {r.outcome for r in bus.results} == {Outcome.PROCESSED}
    [projection] = bus.store.database.order_projection.find({"orderId": 7})
    assert projection["eventsApplied"] == changes
    assert len(projection["history"]) == MAX_HISTORY
    assert projection["history"][-1]["asOf"] == 1655292800 + changes - 1


def test_ordinary_projection_ids_read_as_before() -> None:
    assert projection_id("6231cfc8800d284c981b3146", 59734) == "6231cfc8800d284c981b3146:59734"
    assert projection_id("100%", "a:b") == "100%25:a%3Ab"


ids = st.text(max_size=6, alphabet=st.sampled_from(["a", ":", "%", "3", "A", "é", "2", "5"]))


@given(ids, ids, ids, ids)
def test_projection_ids_are_injective(p1: str, i1: str, p2: str, i2: str) -> None:
    assert (projection_id(p1, i1) == projection_id(p2, i2)) == ((p1, i1) == (p2, i2))


@pytest.mark.parametrize("order_id", [2**63, -(2**63) - 1, 2**200, "", "   ", "x" * 257,
                                      "a\ud800", 1.5, None, True, [1]])
def test_an_order_id_the_store_cannot_keep_is_refused_for_good(bus: LocalBus,
                                                               order_id: Any) -> None:
    data = json.dumps(order("OR_PLC", 1655292800, order_id=order_id))
    result = bus.publish_raw(raw_event("OR_MGMT", data))
    assert result.outcome is Outcome.REJECTED
    assert bus.store.database.order_projection.count_documents({}) == 0


def test_line_items_the_store_cannot_encode_are_refused_for_good(bus: LocalBus) -> None:
    # A state the projection's store refuses is permanent, not a retry loop.
    data = {**order("OR_PLC", 1655292800), "orderLineItems": [{"qty": 2**64}]}
    result = bus.publish_raw(raw_event("OR_MGMT", json.dumps(data)))
    assert result.outcome is Outcome.REJECTED


# -- partner keys and URLs ------------------------------------------------------------------

def hashed(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def test_a_cyrillic_entity_id_reaches_the_partner_with_a_hashed_key(
        bus: LocalBus, partner: PartnerServer) -> None:
    root = bus.publish("OR_MGMT", order("OR_CNF", 1655292804),
                       entity={**ENTITY, "entity_id": "заказ-1"}, version="v2")
    notify = child_key(root, NOTIFY, 0)
    assert [r.outcome for r in bus.results] == [Outcome.PROCESSED] * 3
    (call,) = partner.calls
    assert call.key == hashed(notify) and call.body["idempotencyKey"] == notify
    assert call.body["entity_id"] == "заказ-1"
    assert guard_statuses(bus) == ["SUCCESS"]
    assert bus.store.database.partner_notifications.find_one()["_id"] == notify


def test_a_key_with_a_space_reaches_the_partner(bus: LocalBus, partner: PartnerServer) -> None:
    # The publisher's " lead-1" is scoped ("p:p1: lead-1"): the space is inside, which a
    # header may hold, so the key goes as it is.
    root = bus.publish("OR_MGMT", order("OR_CNF", 1655292804, order_id=2), entity=ENTITY,
                       version="v2", idempotency_key=" lead-1")
    notify = child_key(root, NOTIFY, 0)
    (call,) = partner.calls
    assert root.endswith(" lead-1") and call.key == idempotency_header(notify)
    assert bus.record(child_key(notify, SENT, 0))["event_status"] == "SUCCESS"


@pytest.mark.parametrize("key", [" lead-1/0:PARTNER_NOTIFY", "заказ/0:PARTNER_NOTIFY",
                                 "k\x00/0:PARTNER_NOTIFY", "tail /0:PARTNER_NOTIFY "])
def test_a_key_requests_would_refuse_is_sent_hashed(guard_store: MemoryEventStore,
                                                    partner: PartnerServer, key: str) -> None:
    delivered = client(guard_store).deliver(key, partner.url + "/events", {"a": 1})
    assert delivered.status_code == 200
    (call,) = partner.calls
    assert call.key == hashed(key)
    assert (guard_store.guard_get(key) or {})["status"] == "SUCCESS"


def test_an_ascii_key_is_sent_as_it_is(bus: LocalBus, partner: PartnerServer) -> None:
    root = bus.publish("OR_MGMT", order("OR_CNF", 1655292804, order_id=3), entity=ENTITY,
                       version="v2")
    (call,) = partner.calls
    assert call.key == child_key(root, NOTIFY, 0)


@pytest.mark.parametrize("partner_id", [".", ".."])
def test_dot_partner_ids_are_refused_before_any_call(bus: LocalBus, partner: PartnerServer,
                                                     partner_id: str) -> None:
    root = bus.publish("OR_MGMT", order("OR_CNF", 1655292804),
                       entity={**ENTITY, "partnerId": partner_id}, version="v2")
    notify = child_key(root, NOTIFY, 0)
    assert [r.outcome for r in bus.results] == [Outcome.PROCESSED, Outcome.REJECTED]
    assert partner.calls == []
    record = bus.record(notify)
    assert record["retryable"] is False and record["error"]["type"] == "BadPartnerId"
    guard = bus.store.guard_get(notify)
    assert guard is not None and guard["status"] == "FAILED"
    assert guard["error"]["classification"] == "permanent" and "lease_owner" not in guard


def test_a_slash_in_a_partner_id_stays_inside_one_path_segment(
        bus: LocalBus, partner: PartnerServer) -> None:
    bus.publish("OR_MGMT", order("OR_CNF", 1655292804), entity={**ENTITY, "partnerId": "a/b"},
                version="v2")
    (call,) = partner.calls
    assert call.path == "/partners/a%2Fb/events"
    assert guard_statuses(bus) == ["SUCCESS"]


@pytest.mark.parametrize(("key", "header"), [
    ("order-1:OR_MGMT:abc/0:PARTNER_NOTIFY", "order-1:OR_MGMT:abc/0:PARTNER_NOTIFY"),
    ("a b", "a b"), ("~", "~"), ("x" * 200, "x" * 200),
    (" lead", hashed(" lead")), ("trail ", hashed("trail ")), ("", hashed("")),
    ("x" * 201, hashed("x" * 201)), ("заказ", hashed("заказ")), ("a\x00b", hashed("a\x00b")),
    ("a\ud800", hashed("a\ud800")), ("tab\there", hashed("tab\there")),
    ("sha256:" + "0" * 64, hashed("sha256:" + "0" * 64)), ("a\x7fb", hashed("a\x7fb")),
])
def test_the_idempotency_header_rule(key: str, header: str) -> None:
    assert idempotency_header(key) == header


@given(st.text(max_size=300) | st.sampled_from(["\ud800", "\x00", " x", "x ", "sha256:ab"]))
def test_any_key_gives_a_header_http_can_carry(key: str) -> None:
    header = idempotency_header(key)
    assert header == header.strip() and 0 < len(header) <= 200
    assert all(" " <= char <= "~" for char in header)
    requests.Request("POST", "http://127.0.0.1/", headers={"Idempotency-Key": header}).prepare()
    assert header == key or header.startswith("sha256:")


@given(st.lists(st.text(max_size=12) | st.sampled_from(["\ud800", " a", "sha256:x"]),
                min_size=2, max_size=2, unique=True))
def test_different_keys_get_different_headers(keys: list[str]) -> None:
    assert idempotency_header(keys[0]) != idempotency_header(keys[1])


@given(st.text(max_size=20) | st.sampled_from([".", "..", "", "a/b", "../x", "%2e", "\ud800",
                                               "?q=1", "#f", "a\x00b", "{partnerId}"]))
def test_any_partner_id_gives_one_path_segment_or_is_refused(partner_id: str) -> None:
    try:
        url = partner_url(TEMPLATE, partner_id)
    except BadPartnerId:
        assert partner_id in ("", ".", "..") or not _encodable(partner_id)
        return
    segment = url.removeprefix("http://127.0.0.1:9/partners/").removesuffix("/events")
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert segment not in (".", "..")
    prepared = requests.Request("POST", url).prepare()
    assert prepared.path_url == f"/partners/{segment}/events"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the guard's lease is released on every failure ----------------------------------------

@pytest.fixture()
def guard_store() -> MemoryEventStore:
    return MemoryEventStore()


def client(store: MemoryEventStore) -> PartnerClient:
    return PartnerClient(Guard(store, lease=dt.timedelta(seconds=60), now=FakeClock(NOW)),
                         timeout=2.0)


def broken_url() -> str:
    raise RuntimeError("template could not be filled")


@pytest.mark.parametrize(("url", "error"), [
    (broken_url, RuntimeError),
    (lambda: partner_url(TEMPLATE, ".."), BadPartnerId),
    (lambda: partner_url(TEMPLATE, "\ud800"), BadPartnerId),
    (lambda: "http://127.0.0.1:9/\u0436 /\x00", PartnerUnavailable),
])
def test_a_failure_before_the_call_releases_the_lease(guard_store: MemoryEventStore,
                                                      partner: PartnerServer, url: Any,
                                                      error: type[Exception]) -> None:
    key = "k\ud800 /0:PARTNER_NOTIFY"
    with pytest.raises(error):
        client(guard_store).deliver(key, url, {"a": 1})
    failed = guard_store.guard_get(key)
    assert failed is not None and failed["status"] == "FAILED" and "lease_owner" not in failed
    # Released: the next try runs at once instead of waiting for the lease to expire.
    delivered = client(guard_store).deliver(key, partner.url + "/events", {"a": 1})
    assert delivered.status_code == 200 and not delivered.skipped
    assert partner.calls[-1].key == hashed(key)


# -- hostile payloads through the whole app ------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["\ud800", "a\x00b", "", " ", ".", "..", "a/b", "acme:o", "é" * 300,
                                "заказ", "%", "x" * 600]) | st.text(max_size=8)
HOSTILE_NUMBER = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -1, 0,
                                  2**63, 2**64, 1e12, 1655292804000, 1655292804, 1655292804.5,
                                  NOW.timestamp() + 2 * 86400]) | st.integers() | st.floats()
HOSTILE_VALUE = st.recursive(st.none() | st.booleans() | HOSTILE_NUMBER | HOSTILE_TEXT,
                             lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
                             max_leaves=6)
NUMBERS = itertools.count()


@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(partner_id=HOSTILE_TEXT, entity_id=HOSTILE_TEXT,
       order_id=HOSTILE_VALUE, timestamp=HOSTILE_VALUE,
       status=st.sampled_from(["OR_CNF", "OR_PLC", "OR_SHP"]) | HOSTILE_TEXT,
       items=HOSTILE_VALUE)
def test_hostile_orders_end_acked_and_leave_no_lease(partner: PartnerServer, partner_id: str,
                                                     entity_id: str, order_id: Any,
                                                     timestamp: Any, status: Any,
                                                     items: Any) -> None:
    number = next(NUMBERS)
    entity = {**ENTITY, "partnerId": partner_id, "entity_id": f"{entity_id}-{number}"}
    data = {"orderId": order_id, "orderStatusLatest": status,
            "orderStatusLatestTimestamp": timestamp, "orderLineItems": items}
    body = json.dumps({"event_type": "OR_MGMT", "event_version": "v2",
                       "event_direction": "IN", "entity_metadata": entity,
                       "entity_data": data}, ensure_ascii=True)
    with make_bus(partner) as bus:
        bus.publish_raw(body.encode())
    assert {r.outcome for r in bus.results} <= ACKED, [(r.outcome, r.error) for r in bus.results]
    assert "PROCESSING" not in guard_statuses(bus)
