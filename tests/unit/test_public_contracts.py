"""Public contracts and forwards: declaration errors, mapping, versions side by side, files.

The compatibility check is exercised on real edits of a contract: additive
ones pass, breaking ones fail ``check`` and are refused by ``write``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import Router, contract, path
from eventbus.contracts import files, schemas
from eventbus.contracts.compat import breaking
from eventbus.model.contract import ContractError, ContractViolation, contract_of
from eventbus.model.event import event_from_document
from eventbus.model.forward import forward_key, is_forward
from handlers import public
from tests.hypothesis_profiles import examples

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


@contract("thing-state", "v1")
@dataclasses.dataclass(frozen=True)
class ThingV1:
    """A thing's state."""

    thing_id: str
    count: int
    tags: list[str]
    note: str | None = None


def order(**data: Any) -> dict[str, Any]:
    body = {"orderId": 7, "orderStatusLatest": "OR_SHP",
            "orderStatusLatestTimestamp": 1764000000, "orderLineItems": [{"sku": "a"}]}
    return {"event_type": "OR_MGMT", "event_version": "v2", "event_direction": "IN",
            "entity_metadata": {"partnerId": "p1", "partnerName": "P", "entity_id": "o-7",
                                "entity_type": "Order"},
            "entity_data": {**body, **data}}


def handled(*types: str, internal: bool = False) -> Router:
    routes = Router()
    for name in types:
        routes.handler(name, internal=internal)(lambda context: None)
    return routes


# -- declarations -----------------------------------------------------------------------------


def test_a_contract_reads_its_fields_from_the_dataclass() -> None:
    found = contract_of(ThingV1)
    assert (found.name, found.version, found.ref) == ("thing-state", "v1", "thing-state@v1")
    assert [(f.name, f.kind, f.repeated, f.required) for f in found.fields] == [
        ("thing_id", "string", False, True), ("count", "integer", False, True),
        ("tags", "string", True, True), ("note", "string", False, False)]


@pytest.mark.parametrize(("hint", "default", "message"), [
    (dict, dataclasses.MISSING, "is not str, int"),
    (int | str, dataclasses.MISSING, "a union other than X | None"),
    (str | None, "x", "defaults to None"),
    (list[dict], dataclasses.MISSING, "is not str, int"),
])
def test_a_field_json_cannot_carry_is_refused(hint: Any, default: Any, message: str) -> None:
    fields = [("bad", hint) if default is dataclasses.MISSING
              else ("bad", hint, dataclasses.field(default=default))]
    cls = dataclasses.make_dataclass("Bad", fields, frozen=True)
    with pytest.raises(ContractError, match=message):
        contract("bad-one", "v1")(cls)


@pytest.mark.parametrize(("name", "version"), [("Bad_Name", "v1"), ("ok-name", "1"),
                                               ("ok-name", "v0")])
def test_bad_names_and_versions_are_refused(name: str, version: str) -> None:
    with pytest.raises(ContractError):
        contract(name, version)(dataclasses.make_dataclass("C", [("a", str)]))


def test_a_field_named_version_is_refused() -> None:
    with pytest.raises(ContractError, match="'version' is the contract's own"):
        contract("c-one", "v1")(dataclasses.make_dataclass("C", [("version", str)]))


def test_a_forward_of_an_internal_type_is_refused_when_the_router_is_checked() -> None:
    routes = handled("STEP", internal=True)
    routes.forward("STEP", topic="things", contract=ThingV1,
                   fields={"thing_id": "entity_data.id", "count": "entity_data.n",
                           "tags": "entity_data.tags"})
    with pytest.raises(ContractError, match="internal step"):
        routes.check()


def test_a_forward_of_an_unhandled_type_is_refused() -> None:
    routes = Router()
    routes.forward("NOPE", topic="things", contract=ThingV1,
                   fields={"thing_id": "entity_data.id", "count": "entity_data.n",
                           "tags": "entity_data.tags"})
    with pytest.raises(ContractError, match="no handler for 'NOPE'"):
        Router().include(handled("OTHER"), routes).check()


@pytest.mark.parametrize(("fields", "topic", "message"), [
    ({"thing_id": "entity_data.id", "count": "entity_data.n"}, "things",
     "required field 'tags' is not mapped"),
    ({"thing_id": "entity_data.id", "count": "entity_data.n", "tags": "entity_data.t",
      "colour": "entity_data.c"}, "things", "no field 'colour'"),
    ({"thing_id": "body.id", "count": "entity_data.n", "tags": "entity_data.t"}, "things",
     "'body.id' is not a path in the event"),
    ({"thing_id": "entity_data.id", "count": "entity_data.n", "tags": "entity_data.t"},
     "goog-x", "not a Pub/Sub topic id"),
])
def test_a_contract_that_cannot_be_built_from_the_event_is_refused(
        fields: dict[str, str], topic: str, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        Router().forward("T", topic=topic, contract=ThingV1, fields=fields)


def test_one_topic_serves_one_contract_and_a_field_keeps_its_type() -> None:
    @contract("other", "v2")
    @dataclasses.dataclass(frozen=True)
    class Other:
        thing_id: str

    @contract("thing-state", "v2")
    @dataclasses.dataclass(frozen=True)
    class ThingV2:
        thing_id: int

    for clash, message in ((Other, "serves two contracts"), (ThingV2, "changes type")):
        routes = handled("T")
        routes.forward("T", topic="things", contract=ThingV1, fields={
            "thing_id": "entity_data.id", "count": "entity_data.n", "tags": "entity_data.t"})
        routes.forward("T", topic="things", contract=clash, fields={"thing_id": "entity_data.id"})
        with pytest.raises(ContractError, match=message):
            routes.check()


def test_the_same_version_forwarded_twice_to_a_topic_is_refused() -> None:
    routes = Router()
    routes.forward("T", topic="things", contract=ThingV1, fields={
        "thing_id": "entity_data.id", "count": "entity_data.n", "tags": "entity_data.t"})
    with pytest.raises(ContractError, match="twice"):
        routes.forward("T", topic="things", contract=ThingV1, fields={
            "thing_id": "entity_data.other", "count": "entity_data.n", "tags": "entity_data.t"})


# -- mapping --------------------------------------------------------------------------------


def entries(document: dict[str, Any], previous: list[dict[str, Any]] | None = None
            ) -> list[dict[str, Any]]:
    return public.routes.forwards.entries(event_from_document(document), "k-1", "k-1", NOW,
                                          previous or [])


def test_an_order_is_forwarded_in_both_versions_side_by_side() -> None:
    v1, v2 = entries(order())
    assert [e["contract_version"] for e in (v1, v2)] == ["v1", "v2"]
    assert all(is_forward(e) and e["status"] == "PENDING" for e in (v1, v2))
    assert v1["body"] == {"version": "v1", "order_id": "7", "partner_id": "p1",
                          "status": "OR_SHP", "changed_at": 1764000000}
    assert v2["body"] == {**v1["body"], "version": "v2", "status_name": "shipped",
                          "line_items": 1}
    assert v1["idempotency_key"] == forward_key("k-1", "order-status", "v1") != \
        v2["idempotency_key"]
    assert (v1["source_key"], v1["topic"]) == ("k-1", "order-status")


def test_when_keeps_only_the_statuses_declared() -> None:
    assert entries(order(orderStatusLatest="OR_PLC")) == []


def test_an_event_that_does_not_fit_gets_failed_entries_not_half_built_ones() -> None:
    found = entries(order(orderStatusLatestTimestamp="yesterday"))
    assert [e["status"] for e in found] == ["FAILED", "FAILED"]
    assert all("body" not in e for e in found)
    assert "changed_at: expected integer, got str" in found[0]["error"]["message"]


def test_an_optional_field_that_cannot_be_converted_fails_the_forward() -> None:
    v1, v2 = entries(order(orderLineItems="many"))
    assert v1["status"] == "PENDING" and v2["status"] == "FAILED"
    assert "orderLineItems is not a list" in v2["error"]["message"]


def test_a_forward_already_published_is_kept_as_it_was() -> None:
    first = entries(order())
    first[0].update(status="PUBLISHED", messageId="m-9")
    again = entries(order(), previous=first)
    assert again[0]["status"] == "PUBLISHED" and again[0]["messageId"] == "m-9"
    assert again[1]["status"] == "PENDING"


def test_a_path_converter_maps_none_to_none_and_missing_optional_fields_are_left_out() -> None:
    @contract("opt-one", "v1")
    @dataclasses.dataclass(frozen=True)
    class Opt:
        a: str
        b: int | None = None

    routes = handled("T")
    routes.forward("T", topic="opts", contract=Opt,
                   fields={"a": "entity_data.a", "b": path("entity_data.b", int)})
    document = order(a="x")
    document["event_type"] = "T"
    (entry,) = routes.forwards.entries(event_from_document(document), "k", "k", NOW)
    assert entry["body"] == {"version": "v1", "a": "x"}


HOSTILE = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=20),
    st.sampled_from(["\ud800", "a\x00b", "\udfff tail"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(),
    st.lists(st.integers(), max_size=5),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3), max_leaves=30),
    st.just(list(range(200_000))),
)


@settings(max_examples=examples(150), deadline=None)
@given(order_id=HOSTILE, status=HOSTILE, when=HOSTILE, items=HOSTILE)
def test_hostile_values_give_a_whole_body_or_a_failed_entry(order_id: Any, status: Any,
                                                           when: Any, items: Any) -> None:
    document = order(orderId=order_id, orderStatusLatestTimestamp=when, orderLineItems=items)
    document["entity_data"]["orderStatusLatest"] = "OR_SHP"
    document["entity_metadata"]["partnerId"] = "p1"
    for entry in entries(document):
        if entry["status"] == "FAILED":
            assert "body" not in entry and entry["error"]["message"]
            continue
        body = entry["body"]
        contract_of(public.OrderStatusV2 if body["version"] == "v2"
                    else public.OrderStatusV1).body(body)  # re-checks every value
        json.dumps(body).encode("utf-8")  # publishable text


# -- files, schemas and compatibility -------------------------------------------------------


def test_the_checked_in_contract_files_are_current() -> None:
    report = files.check(public.routes.forwards, ROOT / "docs" / "contracts")
    assert report.current, report


def proto_message(text: str) -> Any:
    """A message class from the generated .proto's fields, as Pub/Sub would compile it."""
    fields = schemas.descriptor_fields(text)
    kinds = {"string": 9, "int64": 3, "double": 1, "bool": 8}
    file = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    message = file.message_type.add(name="M")
    for index, (name, (label, kind, number)) in enumerate(fields.items()):
        field = message.field.add(name=name, number=number, type=kinds[kind],
                                  label=3 if label == "repeated" else 1)
        if label == "optional":
            field.proto3_optional = True
            field.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{name}")
        del index
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.M"))


def test_every_served_version_validates_against_the_topics_proto_schema() -> None:
    text = (ROOT / "docs" / "contracts" / "order-status.proto").read_text()
    cls = proto_message(text)
    for entry in entries(order()):
        parsed = json_format.Parse(json.dumps(entry["body"]), cls())
        assert parsed.version == entry["contract_version"]
    with pytest.raises(json_format.ParseError):
        json_format.Parse('{"order_id": 7, "unknown": 1}', cls())


def routes_with(cls: type) -> Router:
    routes = Router()
    names = {f.name: f"entity_data.{f.name}" for f in dataclasses.fields(cls)}
    routes.forward("T", topic="things", contract=cls, fields=names)
    return routes


def published(tmp_path: Path) -> Path:
    files.write(routes_with(ThingV1).forwards, tmp_path)
    return tmp_path


def edited(**changes: Any) -> type:
    fields: list[Any] = [("thing_id", str), ("count", int), ("tags", list[str]),
                         ("note", str | None, dataclasses.field(default=None))]
    fields = [f for f in fields if f[0] not in changes.get("drop", ())]
    fields += changes.get("add", [])
    fields = [(f[0], changes.get("retype", {}).get(f[0], f[1]), *f[2:]) for f in fields]
    cls = dataclasses.make_dataclass("ThingEdit", fields, frozen=True, kw_only=True)
    return contract("thing-state", "v1")(cls)


def test_an_additive_change_passes_and_is_written(tmp_path: Path) -> None:
    directory = published(tmp_path)
    grown = routes_with(edited(add=[("colour", str | None, dataclasses.field(default=None))]))
    report = files.check(grown.forwards, directory)
    assert report.breaking == [] and "things/v1.schema.json" in report.stale
    files.write(grown.forwards, directory)
    assert files.check(grown.forwards, directory).current
    numbers = schemas.descriptor_fields((directory / "things.proto").read_text())
    assert numbers["colour"][2] == 6 and numbers["note"][2] == 5  # old numbers stay


@pytest.mark.parametrize(("change", "problem"), [
    ({"drop": ("note",)}, "field 'note' was removed"),
    ({"retype": {"count": float}}, "field 'count' changed type"),
    ({"add": [("colour", str)]}, "field 'colour' is newly required"),
    ({"drop": ("count",), "add": [("count", int | None, dataclasses.field(default=None))]},
     "field 'count' is no longer required"),
])
def test_a_breaking_change_fails_the_check_and_is_not_written(
        tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    directory = published(tmp_path)
    before = (directory / "things" / "v1.schema.json").read_text()
    routes = routes_with(edited(**change))
    report = files.check(routes.forwards, directory)
    assert any(problem in line for line in report.breaking), report.breaking
    with pytest.raises(files.BreakingChange):
        files.write(routes.forwards, directory)
    assert (directory / "things" / "v1.schema.json").read_text() == before


def test_a_version_no_longer_served_is_breaking_and_a_new_version_is_not(tmp_path: Path) -> None:
    directory = published(tmp_path)

    @contract("thing-state", "v2")
    @dataclasses.dataclass(frozen=True)
    class ThingV2:
        thing_id: str

    only_v2 = files.check(routes_with(ThingV2).forwards, directory)
    assert any("no longer served" in line for line in only_v2.breaking)
    both = routes_with(ThingV1)
    both.forward("T", topic="things", contract=ThingV2, fields={"thing_id": "entity_data.x"})
    report = files.check(both.forwards, directory)
    assert report.breaking == [] and "things/v2.schema.json" in report.stale


def test_compat_reads_schemas_alone() -> None:
    old = schemas.json_schema(contract_of(ThingV1))
    assert breaking(old, old) == []


def test_contract_body_refuses_what_does_not_fit() -> None:
    spec = contract_of(ThingV1)
    with pytest.raises(ContractViolation, match="count: expected integer"):
        spec.body({"thing_id": "a", "count": True, "tags": []})
    with pytest.raises(ContractViolation, match="tags: expected a list"):
        spec.body({"thing_id": "a", "count": 1, "tags": "x"})
    with pytest.raises(ContractViolation, match="thing_id: expected string"):
        spec.body({"thing_id": "\ud800", "count": 1, "tags": []})
    with pytest.raises(ContractViolation, match="count: expected integer"):
        spec.body({"thing_id": "a", "count": 2**64, "tags": []})
