"""The archive reader (``eventbus.rebuild.archive``) on files the tests write in the subscription's
Avro layout: read back exactly, turned into the delivery the processor takes, and hostile
files and records each a clear problem that stops nothing else."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.model.delivery import Delivery
from eventbus.model.router import Router
from eventbus.processor import Intake
from eventbus.rebuild.archive import (
    SUBSCRIPTION_SCHEMA,
    ArchivedMessage,
    ArchiveError,
    ArchiveProblem,
    archived_event,
    read_archive,
    read_file,
    to_delivery,
)
from eventbus.settings import PUBSUB_MAX_DATA_BYTES
from eventbus.store.memory import MemoryEventStore
from tests.archive_files import (
    PUBLISHED,
    SCHEMA,
    SUBSCRIPTION,
    avro_bytes,
    disguised,
    event_message,
    raw_schema,
    record,
    write_archive,
)
from tests.hypothesis_profiles import examples

Item = ArchivedMessage | ArchiveProblem


def messages(items: Iterable[Item]) -> list[ArchivedMessage]:
    return [i for i in items if isinstance(i, ArchivedMessage)]


def problems(items: Iterable[Item]) -> list[ArchiveProblem]:
    return [i for i in items if isinstance(i, ArchiveProblem)]


def event_record(number: int, **options: Any) -> dict[str, Any]:
    data, attributes = event_message(number)
    return record(data, attributes, message_id=str(1000 + number), **options)


# -- the layout, read back -----------------------------------------------------------------

def test_the_layout_is_the_schema_pubsub_documents() -> None:
    assert SUBSCRIPTION_SCHEMA == SCHEMA


def test_a_directory_is_read_recursively_in_name_order_and_every_field_comes_back(
        tmp_path: Path) -> None:
    # Written in another order than their names: name order is the order they are read in.
    write_archive(tmp_path / "2024-03-02" / "b.avro", [event_record(3)])
    write_archive(tmp_path / "2024-03-01" / "z.avro", [event_record(2)])
    write_archive(tmp_path / "2024-03-01" / "a.avro",
                  [event_record(0), event_record(1, ordering_key="o-1")])

    items = list(read_archive(tmp_path))

    assert problems(items) == []
    found = messages(items)
    assert [m.message_id for m in found] == ["1000", "1001", "1002", "1003"]
    first, second = found[0], found[1]
    data, attributes = event_message(1)
    assert second == ArchivedMessage(
        data=data, attributes=attributes, message_id="1001", publish_time=PUBLISHED,
        ordering_key="o-1", subscription=SUBSCRIPTION,
        file=str(tmp_path / "2024-03-01" / "a.avro"), index=1)
    assert "ordering_key" not in second.attributes and first.ordering_key == ""
    assert second.publish_time.tzinfo is not None
    assert [(Path(m.file).name, m.index) for m in found] == [
        ("a.avro", 0), ("a.avro", 1), ("z.avro", 0), ("b.avro", 0)]


def test_one_file_is_read_as_an_archive_of_one(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "one", [event_record(0), event_record(1)])
    assert [m.index for m in messages(read_archive(path))] == [0, 1]


def test_a_deflated_file_and_one_of_many_blocks_are_read_whole(tmp_path: Path) -> None:
    records = [event_record(n) for n in range(40)]
    write_archive(tmp_path / "a", records, codec="deflate")
    write_archive(tmp_path / "b", records, sync_interval=300)
    found = list(read_archive(tmp_path))
    assert problems(found) == []
    assert [m.index for m in messages(found)] == list(range(40)) * 2


def test_attributes_written_as_a_json_string_are_read_too(tmp_path: Path) -> None:
    data, attributes = event_message(0)
    path = tmp_path / "json.avro"
    path.write_bytes(avro_bytes(
        [{**record(data), "attributes": json.dumps({**attributes, "ordering_key": "o"})}],
        raw_schema(attributes="string")))
    (found,) = list(read_archive(path))
    assert isinstance(found, ArchivedMessage)
    assert (found.attributes, found.ordering_key) == (attributes, "o")


# -- into the pipeline ---------------------------------------------------------------------

def test_an_archived_message_is_the_delivery_the_pull_worker_builds(tmp_path: Path) -> None:
    write_archive(tmp_path / "a", [event_record(7, ordering_key="o-7")])
    (message,) = messages(read_archive(tmp_path))
    delivery = to_delivery(message)
    data, attributes = event_message(7)
    assert delivery == Delivery(data=data, attributes=attributes, message_id="1007",
                                publish_time=PUBLISHED.isoformat(), subscription=SUBSCRIPTION,
                                delivery_attempt=None, ordering_key="o-7", form="archive")
    assert isinstance(delivery, Delivery) and delivery.published_at() == PUBLISHED


def test_an_archived_message_lands_on_the_key_the_live_message_had(tmp_path: Path) -> None:
    routes = Router()
    routes.handler("OR_MGMT")(lambda context: None)
    intake = Intake(MemoryEventStore(), routes)
    write_archive(tmp_path / "a", [event_record(3)])
    (message,) = messages(read_archive(tmp_path))
    delivery = to_delivery(message)
    assert isinstance(delivery, Delivery)
    data, attributes = event_message(3)
    live = intake.locate(Delivery(data, attributes, message_id="1003", form="pull"))
    archived = intake.locate(delivery)
    assert archived.error is None and archived.key == live.key
    assert archived.fingerprint == live.fingerprint
    event = archived_event(message)
    assert not isinstance(event, ArchiveProblem) and event.entity_data == {"n": 3}


@pytest.mark.parametrize(("body", "why"), [
    (b"not json", "payload is not JSON"),
    (b"[1, 2]", "payload must be a JSON object"),
    (json.dumps({"event_type": "OR_MGMT"}).encode(), "entity_metadata"),
    (b"", "payload is not JSON"),
])
def test_a_body_that_is_not_an_event_is_a_problem_naming_the_record(
        tmp_path: Path, body: bytes, why: str) -> None:
    write_archive(tmp_path / "a", [event_record(0), record(body, message_id="77")])
    good, bad = messages(read_archive(tmp_path))
    assert isinstance(to_delivery(good), Delivery)
    found = to_delivery(bad)
    assert isinstance(found, ArchiveProblem)
    assert (found.file, found.index, found.message_id) == (str(tmp_path / "a"), 1, "77")
    assert found.reason.startswith("not an event") and why in found.reason
    assert archived_event(bad) == found


# -- hostile files: one problem each, and the rest is read ---------------------------------

def hostile_files(root: Path) -> dict[str, str]:
    """Write one hostile file per case beside good ones; returns name -> expected reason."""
    good = [event_record(n) for n in range(3)]
    write_archive(root / "00-good", good)
    whole = avro_bytes([event_record(n) for n in range(30)], sync_interval=200)
    (root / "01-truncated").write_bytes(whole[: len(whole) * 2 // 3])
    (root / "02-not-avro").write_text("subscription_name,message_id\n")
    (root / "03-empty").write_bytes(b"")
    (root / "04-other-schema").write_bytes(avro_bytes(
        [{"id": 1}], {"type": "record", "name": "Other", "fields": [
            {"name": "id", "type": "long"}]}))
    (root / "05-no-metadata").write_bytes(avro_bytes(
        [{"data": b"{}"}], {"type": "record", "name": "PubsubMessage",
                            "namespace": "com.google.pubsub",
                            "fields": [{"name": "data", "type": "bytes"}]}))
    (root / "06-wrong-type").write_bytes(avro_bytes(
        [{**event_record(0), "publish_time": "yesterday"}], raw_schema(publish_time="string")))
    write_archive(root / "99-good", good)
    return {"01-truncated": "cut short or corrupt from here",
            "02-not-avro": "not an Avro file",
            "03-empty": "not an Avro file",
            "04-other-schema": "no field subscription_name, message_id, publish_time, "
                               "attributes, data",
            "05-no-metadata": "written without metadata",
            "06-wrong-type": "unexpected type of publish_time ('string')"}


def test_each_hostile_file_is_one_clear_problem_and_the_others_are_read(tmp_path: Path) -> None:
    expected = hostile_files(tmp_path)
    items = list(read_archive(tmp_path))
    found = {Path(p.file).name: p for p in problems(items)}
    assert sorted(found) == sorted(expected)
    for name, reason in expected.items():
        assert reason in found[name].reason, (name, found[name].reason)
        assert "\n" not in str(found[name])
    read = [(Path(m.file).name, m.index) for m in messages(items)]
    assert [r for r in read if r[0] in ("00-good", "99-good")] == [
        ("00-good", 0), ("00-good", 1), ("00-good", 2), ("99-good", 0), ("99-good", 1),
        ("99-good", 2)]
    # The truncated file gives what came before the cut, then says where it stopped.
    truncated = [i for _, i in [r for r in read if r[0] == "01-truncated"]]
    assert truncated and truncated == list(range(len(truncated)))
    assert found["01-truncated"].index == len(truncated)
    assert f"from record {len(truncated)}" in str(found["01-truncated"])
    assert found["02-not-avro"].index is None


def hostile_records() -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(record, fields the writer schema changes, reason) for each hostile record."""
    data = event_message(0)[0]
    many = {f"a{n}": "x" for n in range(101)}
    return [
        (record(data, {"bad\x00name": "v"}), {}, "an attribute name holds NUL"),
        (record(data, {"k": "v\x00"}), {}, "attribute 'k' holds NUL"),
        (record(data, message_id=""), {}, "message_id is empty"),
        (record(data, message_id="1\x002"), {}, "message_id holds NUL"),
        (record(data, many), {}, "101 attributes; Pub/Sub carries at most 100"),
        (record(b"x" * (PUBSUB_MAX_DATA_BYTES + 1)), {}, "larger than Pub/Sub carries"),
        ({**record(data), "message_id": b"\xed\xa0\x80"}, {"message_id": "bytes"},
         "message_id is not valid UTF-8"),
        ({**record(data), "subscription_name": b"\xff"}, {"subscription_name": "bytes"},
         "subscription_name is not valid UTF-8"),
        ({**record(data), "attributes": {"k": b"\xc3"}},
         {"attributes": {"type": "map", "values": "bytes"}}, "attribute 'k' is not valid UTF-8"),
    ]


def test_each_hostile_record_is_a_problem_of_its_own_and_its_neighbours_are_read(
        tmp_path: Path) -> None:
    cases = hostile_records()
    for number, (bad, types, _) in enumerate(cases):
        neighbours = [event_record(1), bad, event_record(2)]
        (tmp_path / f"{number:02}").write_bytes(disguised(neighbours, raw_schema(**types)))
    items = list(read_archive(tmp_path))
    for number, (_, _, reason) in enumerate(cases):
        name = str(tmp_path / f"{number:02}")
        of_file = [i for i in items if i.file == name]
        assert [type(i) for i in of_file] == [ArchivedMessage, ArchiveProblem, ArchivedMessage]
        assert of_file[1].index == 1 and reason in of_file[1].reason, of_file[1]
        assert [i.index for i in of_file] == [0, 1, 2]


@pytest.mark.parametrize(("value", "reason"), [
    ("[1, 2]", "attributes are a JSON list, not an object"),
    ('{"k": 1}', "attribute 'k' is int, not text"),
    ('{"k": "\\ud800"}', "attribute 'k' is not valid UTF-8 (or holds a lone surrogate)"),
    ('{"\\udfff": "v"}', "an attribute name is not valid UTF-8"),
    pytest.param("{" * 100_000, "attributes are not JSON", id="nested-too-deep"),
    ("", "attributes are not JSON"),
])
def test_attributes_in_a_json_string_that_are_not_an_object_of_text_are_a_problem(
        tmp_path: Path, value: str, reason: str) -> None:
    path = tmp_path / "json.avro"
    path.write_bytes(avro_bytes([{**record(b"{}"), "attributes": value}],
                                raw_schema(attributes="string")))
    (found,) = list(read_archive(path))
    assert isinstance(found, ArchiveProblem) and reason in found.reason
    assert found.index == 0 and len(found.reason) <= 300


def test_a_record_that_cannot_be_decoded_costs_its_block_and_the_next_block_is_read(
        tmp_path: Path) -> None:
    micros = [int(n * 1e6) for n in range(12)]
    micros[4] = 2**62  # past year 9999: fastavro cannot make it a datetime
    path = tmp_path / "late"
    path.write_bytes(disguised(
        [{**event_record(n), "publish_time": t} for n, t in enumerate(micros)],
        raw_schema(publish_time="long"), sync_interval=300))
    items = list(read_archive(path))
    (bad,) = problems(items)
    assert bad.index == 4 and "cannot be decoded" in bad.reason and "date value" in bad.reason
    lost = range(bad.index, bad.index + bad.count)
    assert [m.index for m in messages(items)] == [n for n in range(12) if n not in lost]
    assert 11 in [m.index for m in messages(items)]


def test_a_block_that_claims_more_than_the_file_holds_is_a_problem_not_a_crash(
        tmp_path: Path) -> None:
    whole = avro_bytes([event_record(0)])
    header_end = len(avro_bytes([], SCHEMA))
    # One record: count 1 (one byte), then its size in two bytes (64..8191).
    assert whole[header_end] == 2 and whole[header_end + 1] & 0x80
    assert not whole[header_end + 2] & 0x80
    # The block's byte count (the second varint) claims 2**40 bytes.
    huge = bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x40])
    (tmp_path / "huge").write_bytes(whole[:header_end + 1] + huge + whole[header_end + 3:])
    (found,) = list(read_archive(tmp_path / "huge"))
    assert isinstance(found, ArchiveProblem)
    assert str(found).startswith(f"{tmp_path / 'huge'} from record 0: unreadable past its header")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_a_fifo_in_the_directory_is_named_and_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    write_archive(tmp_path / "good", [event_record(0)])
    items = list(read_archive(tmp_path))
    assert [(Path(p.file).name, p.reason) for p in problems(items)] == [
        ("pipe", "not a regular file")]
    assert len(messages(items)) == 1


def test_a_file_name_that_is_not_text_is_shown_escaped(tmp_path: Path) -> None:
    name = os.fsdecode(b"bad-\xff-\x1b[31m\nname")
    (tmp_path / name).write_bytes(b"junk")
    (found,) = list(read_archive(tmp_path))
    assert isinstance(found, ArchiveProblem)
    assert "\n" not in found.file and found.file.encode("utf-8")
    assert "bad-\\xff-" in found.file and "\\n" in found.file


# -- the source ----------------------------------------------------------------------------

@pytest.mark.parametrize(("source", "message"), [
    ("/no/such/archive", "no such file or directory"),
    ("s3://bucket/prefix", "a local path or a gs://bucket/prefix URL"),
    ("gs://", "no bucket"),
    ("gs:///prefix", "no bucket"),
])
def test_a_source_that_cannot_be_listed_raises_one_clear_error(source: str,
                                                              message: str) -> None:
    with pytest.raises(ArchiveError, match=message):
        read_archive(source, storage_client=FakeStorage({}))


@dataclasses.dataclass
class FakeBlob:
    name: str
    content: bytes
    broken: bool = False

    def open(self, mode: str = "r") -> io.BytesIO:
        assert mode == "rb"
        if self.broken:
            raise PermissionError("403 GET storage.googleapis.com: forbidden")
        return io.BytesIO(self.content)


class FakeStorage:
    """``google.cloud.storage.Client``'s ``list_blobs``, over a dict of objects."""

    def __init__(self, objects: dict[str, list[FakeBlob]], fail: Exception | None = None):
        self.objects, self.fail = objects, fail
        self.listed: list[tuple[str, str | None]] = []

    def list_blobs(self, bucket_or_name: Any, prefix: str | None = None) -> list[FakeBlob]:
        self.listed.append((bucket_or_name, prefix))
        if self.fail:
            raise self.fail
        return [b for b in reversed(self.objects.get(bucket_or_name, []))
                if b.name.startswith(prefix or "")]


def test_a_gs_url_lists_its_prefix_and_reads_the_objects_in_name_order() -> None:
    objects = {"acme-archive": [
        FakeBlob("bus/2024-03-01T10/a", avro_bytes([event_record(0), event_record(1)])),
        FakeBlob("bus/", b""),  # a folder placeholder, not a file
        FakeBlob("bus/2024-03-01T09/z", avro_bytes([event_record(2)])),
        FakeBlob("bus/2024-03-01T11/forbidden", b"", broken=True),
        FakeBlob("bus/2024-03-01T12/junk", b"not avro"),
        FakeBlob("other/x", avro_bytes([event_record(3)])),
    ]}
    storage = FakeStorage(objects)
    items = list(read_archive("gs://acme-archive/bus/", storage_client=storage))
    assert storage.listed == [("acme-archive", "bus/")]
    assert [(m.file, m.index, m.message_id) for m in messages(items)] == [
        ("gs://acme-archive/bus/2024-03-01T09/z", 0, "1002"),
        ("gs://acme-archive/bus/2024-03-01T10/a", 0, "1000"),
        ("gs://acme-archive/bus/2024-03-01T10/a", 1, "1001")]
    assert [(p.file, p.reason.split(":")[0]) for p in problems(items)] == [
        ("gs://acme-archive/bus/2024-03-01T11/forbidden", "cannot be read"),
        ("gs://acme-archive/bus/2024-03-01T12/junk", "not an Avro file")]
    assert "forbidden" in problems(items)[0].reason


def test_a_whole_bucket_is_listed_without_a_prefix() -> None:
    storage = FakeStorage({"b": [FakeBlob("x", avro_bytes([event_record(0)]))]})
    assert len(messages(read_archive("gs://b", storage_client=storage))) == 1
    assert storage.listed == [("b", None)]


def test_a_bucket_that_cannot_be_listed_raises_at_once() -> None:
    storage = FakeStorage({}, fail=RuntimeError("404 bucket acme-archive not found"))
    with pytest.raises(ArchiveError, match="gs://acme-archive/x cannot be listed: 404"):
        read_archive("gs://acme-archive/x", storage_client=storage)


# -- hostile values, generated -------------------------------------------------------------

# Text as a writer of the layout can write it (no lone surrogates: UTF-8 cannot hold them),
# NUL and control characters included.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
RAW = st.binary(max_size=40)  # bytes where the layout says string: UTF-8 or not
FIELD = st.one_of(TEXT.map(str.encode), RAW)


@st.composite
def hostile(draw: st.DrawFn) -> dict[str, Any]:
    attributes = draw(st.dictionaries(TEXT, FIELD, max_size=4))
    if draw(st.booleans()):
        attributes |= {f"a{n}": b"x" for n in range(draw(st.integers(95, 105)))}
    return {"subscription_name": draw(FIELD), "message_id": draw(FIELD),
            "publish_time": draw(st.integers(0, 253402300799999999)),
            "attributes": attributes,
            "data": draw(st.one_of(st.binary(max_size=60),
                                   st.sampled_from([event_message(0)[0], b"{}", b"\x00"])))}


def valid(raw: dict[str, Any]) -> bool:
    """The oracle: what a message must be to come back, from the raw written values."""
    def text(value: bytes) -> bool:
        try:
            return "\x00" not in value.decode("utf-8")
        except UnicodeDecodeError:
            return False
    attributes = {k: v for k, v in raw["attributes"].items() if k != "ordering_key"}
    size = len(raw["data"]) + sum(len(k.encode()) + len(v) for k, v in raw["attributes"].items())
    return (text(raw["subscription_name"]) and text(raw["message_id"]) and raw["message_id"] != b""
            and all(text(k.encode()) and text(v) for k, v in raw["attributes"].items())
            and len(attributes) <= 100 and size <= PUBSUB_MAX_DATA_BYTES)


BYTES_LAYOUT = raw_schema(subscription_name="bytes", message_id="bytes", publish_time="long",
                          attributes={"type": "map", "values": "bytes"})


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(st.lists(hostile(), min_size=1, max_size=5))
def test_hostile_values_give_a_message_or_a_one_line_problem_per_record(
        raws: list[dict[str, Any]]) -> None:
    stream = io.BytesIO(disguised(raws, BYTES_LAYOUT))
    items = list(read_file(stream, "hostile.avro"))

    assert [i.index for i in items] == list(range(len(raws)))
    for raw, item in zip(raws, items, strict=True):
        assert isinstance(item, ArchivedMessage) == valid(raw), (raw, item)
        if isinstance(item, ArchiveProblem):
            assert "\n" not in str(item) and len(item.reason) <= 300
            str(item).encode("utf-8")  # printable: no lone surrogate
            continue
        assert item.data == raw["data"] and item.message_id == raw["message_id"].decode()
        assert item.publish_time == dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=raw["publish_time"])
        expected = {k: v.decode() for k, v in raw["attributes"].items()}
        assert item.ordering_key == expected.pop("ordering_key", "")
        assert item.attributes == expected
        assert isinstance(to_delivery(item), Delivery | ArchiveProblem)


@settings(max_examples=examples(200), deadline=None)
@given(st.data())
def test_a_damaged_file_never_raises(data: st.DataObject) -> None:
    whole = bytearray(avro_bytes([event_record(n) for n in range(8)], sync_interval=200))
    for _ in range(data.draw(st.integers(1, 6))):
        whole[data.draw(st.integers(0, len(whole) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(whole)))
    items = list(read_file(io.BytesIO(bytes(whole[:cut])), "damaged.avro"))

    assert all(isinstance(i, ArchivedMessage | ArchiveProblem) for i in items)
    assert all("\n" not in str(i) for i in problems(items))
    if cut < len(avro_bytes([], SCHEMA)):  # not even a header: the file is named
        assert problems(items) and problems(items)[0].index is None
