import pytest

from eventbus.model import router as router_module
from eventbus.model.context import Context
from eventbus.model.errors import (
    DuplicateHandler,
    InvalidEvent,
    UnknownEventType,
    UnsupportedVersion,
)
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.keys import (
    KEYED_ATTRIBUTES,
    child_key,
    conflict_key,
    digest,
    fingerprint,
    message_key,
    partner_scope,
    record_key,
    rejected_key,
)
from eventbus.model.router import Router

META = EntityMetadata(partner_id="p1", entity_id="order-1", entity_type="Order")


def event(version: str = "v1", **data: object) -> Event:
    return Event("OR_MGMT", version, "IN", META, dict(data))


def test_publisher_key_wins_scoped_by_partner() -> None:
    assert message_key(event(), "k-1") == "k-1"
    assert record_key(event(), {"idempotency_key": "k-1"}) == "p:p1:k-1"


def test_derived_key_is_stable_and_changes_with_the_payload() -> None:
    first, again = record_key(event(status="A"), {}), record_key(event(status="A"), {})
    assert first == again and first.startswith("p:p1:order-1:OR_MGMT:")
    assert record_key(event(status="B"), {}) != first
    assert record_key(event(status="A"), {}) == \
        record_key(event(status="A"), {"idempotency_key": message_key(event(status="A"))})


def test_unprintable_huge_or_child_shaped_key_is_invalid() -> None:
    for bad in ("a\nb", "x" * 513, "\ud800", "order/0:PARTNER_NOTIFY", "a/12:B"):
        with pytest.raises(InvalidEvent):
            record_key(event(), {"idempotency_key": bad})


def test_one_partner_cannot_take_another_partners_key() -> None:
    other = Event("OR_MGMT", "v1", "IN", EntityMetadata("acme:o", "e", "Order"), {})
    mine = Event("OR_MGMT", "v1", "IN", EntityMetadata("acme", "e", "Order"), {})
    assert record_key(other, {"idempotency_key": "1"}) != \
        record_key(mine, {"idempotency_key": "o:1"})
    assert partner_scope("a:b/c") == "a%3Ab%2Fc"


def test_child_keys_are_deterministic_and_distinct() -> None:
    assert child_key("k", "NOTIFY", 0) == child_key("k", "NOTIFY", 0)
    assert len({child_key("k", "A", 0), child_key("k", "A", 1), child_key("k", "B", 0)}) == 3
    assert len(child_key("k" * 600, "A", 0)) < 100


def test_rejected_and_conflict_keys_accept_any_text() -> None:
    assert rejected_key(b"x", {"event_type": "\ud800"}).startswith("invalid:")
    assert rejected_key(b"\xff\x00", {"\udfff": "\ud800"}).startswith("invalid:")
    assert conflict_key("\ud800", "f").startswith("conflict:")
    assert digest("\udfff") == digest("\udfff")


def test_a_rejected_key_is_of_the_bytes_and_the_attributes_read_not_the_message() -> None:
    # The same bytes are one refused record however often they come: no message id.
    assert rejected_key(b"x", {}) == rejected_key(b"x") == rejected_key(b"x", None)
    assert rejected_key(b"x", {}) != rejected_key(b"y", {})
    # An attribute nobody reads (the trace context each publish carries) changes nothing.
    traced = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": "a=b"}
    assert rejected_key(b"x", traced) == rejected_key(b"x", {})
    # The attributes the bytes are read with do: each read is its own refusal.
    keys = {rejected_key(b"x", {name: "v"}) for name in KEYED_ATTRIBUTES}
    assert len(keys | {rejected_key(b"x", {})}) == len(KEYED_ATTRIBUTES) + 1
    assert rejected_key(b"x", {"event_type": "A"}) != rejected_key(b"x", {"event_type": "B"})
    # Data that was not even base64 is not the same bytes delivered decodable.
    assert rejected_key(b"x", undecodable=True) != rejected_key(b"x")
    # No attribute value and data can be read as another split of the same text.
    assert rejected_key(b'"]x', {"event_type": "a"}) != rejected_key(b"x", {"event_type": 'a"]'})


def test_fingerprints_are_equal_for_equal_payloads_only() -> None:
    assert fingerprint(event(a=1)) == fingerprint(event(a=1))
    assert fingerprint(event(a=1)) != fingerprint(event(a=2))
    assert fingerprint(event(a="\ud800")) == fingerprint(event(a="\ud800"))


def noop(context: Context) -> None:
    pass


def test_router_rejects_a_second_handler_for_a_type() -> None:
    router = Router()
    router.handler("OR_MGMT")(noop)

    def other(context: Context) -> None:
        pass

    with pytest.raises(DuplicateHandler, match="OR_MGMT"):
        router.handler("OR_MGMT")(other)


def test_router_upcasts_chains_and_rejects_unknown() -> None:
    router = Router()
    router.handler("OR_MGMT", versions=("v3",), upcasters={
        "v1": lambda e: e.with_version("v2", {**e.entity_data, "v2": True}),
        "v2": lambda e: e.with_version("v3", {**e.entity_data, "v3": True}),
    })(noop)
    _, upcast = router.resolve(event("v1"))
    assert upcast.event_version == "v3" and upcast.entity_data == {"v2": True, "v3": True}
    with pytest.raises(UnsupportedVersion):
        router.resolve(event("v9"))
    with pytest.raises(UnknownEventType):
        router.resolve(Event("NOPE", "v1", "IN", META, {}))


@pytest.mark.parametrize(("upcaster", "says"), ids=["none", "dict", "metadata"], argvalues=[
    (lambda e: None, "returned NoneType, not an Event"),
    (lambda e: e.to_document(), "returned dict, not an Event"),
    (lambda e: Event("OR_MGMT", "v2", "IN", {"partnerId": "p"}, {}),  # type: ignore[arg-type]
     "returned an Event whose entity_metadata is dict, not EntityMetadata"),
])
def test_an_upcaster_that_returns_no_event_raises_type_error(upcaster: object,
                                                             says: str) -> None:
    router = Router()
    router.handler("OR_MGMT", versions=("v2",), upcasters={"v1": upcaster})(noop)  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=f"the OR_MGMT upcaster of v1 {says}"):
        router.resolve(event("v1"))


# --- routers of their own, included into one (no global router) ----------------------------


def test_there_is_no_global_router() -> None:
    assert not any(isinstance(value, Router) for value in vars(router_module).values())
    first, second = Router(), Router()
    first.handler("OR_MGMT")(noop)
    assert first.event_types() == ["OR_MGMT"] and second.event_types() == []


def test_include_merges_the_routes_of_other_routers() -> None:
    orders, promotions = Router(), Router()
    orders.handler("OR_MGMT", versions=("v2",), upcasters={
        "v1": lambda e: e.with_version("v2", {"upcast": True})})(noop)

    def on_promo(context: Context) -> None:
        pass

    promotions.handler("PROMO")(on_promo)
    app = Router()
    assert app.include(orders, promotions) is app  # chainable, like the app's create_router
    assert app.event_types() == ["OR_MGMT", "PROMO"]
    route, upcast = app.resolve(event("v1"))
    assert route.handler is noop and upcast.entity_data == {"upcast": True}
    assert app.route_for(Event("PROMO", "v1", "IN", META, {})).handler is on_promo
    assert orders.event_types() == ["OR_MGMT"]  # the included routers are unchanged


def test_a_type_handled_by_two_included_routers_is_a_duplicate() -> None:
    first, second = Router(), Router()
    first.handler("OR_MGMT")(noop)

    def other(context: Context) -> None:
        pass

    second.handler("OR_MGMT")(other)
    with pytest.raises(DuplicateHandler, match="OR_MGMT"):
        Router().include(first, second)
    own = Router()
    own.handler("OR_MGMT")(other)
    with pytest.raises(DuplicateHandler, match="OR_MGMT"):
        own.include(first)


def test_including_the_same_routes_twice_is_harmless() -> None:
    routes = Router()
    routes.handler("OR_MGMT")(noop)
    app = Router().include(routes, routes)
    app.include(routes)
    assert app.event_types() == ["OR_MGMT"]
