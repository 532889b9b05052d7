"""The wire parser on its own: valid messages, every refusal, and fuzzing.

The property that matters: whatever bytes arrive, parsing either yields a
Request or raises FramingError / MessageError; nothing else escapes.
"""

from __future__ import annotations

import struct

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localdb.gateway import wire
from localdb.gateway.errors import Code


def op_msg(body: dict, sequences: dict[str, list[dict]] | None = None, flags: int = 0,
           request_id: int = 7, checksum: bool = False) -> bytes:
    payload = struct.pack("<I", flags | (wire.CHECKSUM_PRESENT if checksum else 0))
    payload += b"\x00" + bson.encode(body)
    for name, docs in (sequences or {}).items():
        section = name.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        payload += b"\x01" + struct.pack("<i", 4 + len(section)) + section
    length = 16 + len(payload) + (4 if checksum else 0)
    message = struct.pack("<iiii", length, request_id, 0, wire.OP_MSG) + payload
    if checksum:
        message += struct.pack("<I", wire.crc32c(message))
    return message


def op_query(body: dict, namespace: str = "admin.$cmd", request_id: int = 3) -> bytes:
    payload = struct.pack("<i", 0) + namespace.encode() + b"\x00" + struct.pack("<ii", 0, -1)
    payload += bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, wire.OP_QUERY) + payload


def parse(message: bytes) -> wire.Request:
    header = wire.parse_header(message[:16])
    return wire.parse_message(header, message[16:])


def test_op_msg_body_and_sequence() -> None:
    docs = [{"_id": 1}, {"_id": 2, "x": "y"}]
    request = parse(op_msg({"insert": "c", "$db": "d"}, {"documents": docs}))
    assert request.name == "insert"
    assert request.db == "d"
    assert request.raw_body == bson.encode({"insert": "c", "$db": "d"})
    assert request.sequences["documents"].documents == docs
    assert request.sequences["documents"].raw == b"".join(bson.encode(d) for d in docs)
    assert not request.more_to_come and not request.legacy


def test_op_msg_flags_and_checksum() -> None:
    request = parse(op_msg({"ping": 1}, flags=wire.MORE_TO_COME, checksum=True))
    assert request.more_to_come
    corrupted = bytearray(op_msg({"ping": 1}, checksum=True))
    corrupted[-1] ^= 0xFF
    with pytest.raises(wire.MessageError, match="checksum"):
        parse(bytes(corrupted))


def test_crc32c_known_value() -> None:
    assert wire.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_op_query_handshake() -> None:
    request = parse(op_query({"isMaster": 1, "helloOk": True}))
    assert request.legacy and request.name == "isMaster" and request.db == "admin"
    wrapped = parse(op_query({"$query": {"hello": 1}, "$readPreference": {"mode": "primary"}}))
    assert wrapped.name == "hello"


@pytest.mark.parametrize("message, code", [
    (op_query({"find": "c"}), Code.UnsupportedOpQueryCommand),
    (op_query({"hello": 1}, namespace="db.coll"), Code.UnsupportedOpQueryCommand),
])
def test_op_query_refusals_are_legacy(message: bytes, code: Code) -> None:
    with pytest.raises(wire.MessageError) as caught:
        parse(message)
    assert caught.value.legacy and caught.value.code == code


def test_unknown_opcode_and_flags() -> None:
    header = wire.Header(20, 1, 0, 2002)  # OP_INSERT: removed from MongoDB
    with pytest.raises(wire.MessageError) as caught:
        wire.parse_message(header, b"\x00" * 4)
    assert caught.value.code == Code.CommandNotSupported
    with pytest.raises(wire.MessageError, match="flag"):
        parse(op_msg({"ping": 1}, flags=1 << 4))


@pytest.mark.parametrize("length", [0, 16, -5, wire.MAX_MESSAGE_BYTES + 1])
def test_impossible_lengths_are_framing_errors(length: int) -> None:
    with pytest.raises(wire.FramingError):
        wire.parse_header(struct.pack("<iiii", length, 1, 0, wire.OP_MSG))
    with pytest.raises(wire.FramingError):
        wire.parse_header(b"\x01\x02")


def test_bad_bson_is_a_message_error() -> None:
    good = op_msg({"ping": 1})
    bad = bytearray(good)
    bad[16 + 5 + 4] = 0x20  # element type byte of "ping": not a BSON type
    with pytest.raises(wire.MessageError) as caught:
        parse(bytes(bad))
    assert caught.value.code == Code.InvalidBSON


def test_bad_sequence_document_is_refused() -> None:
    message = bytearray(op_msg({"insert": "c"}, {"documents": [{"a": 1}]}))
    message[-8] = 0x20  # element type byte of the last document: not a BSON type
    with pytest.raises(wire.MessageError):
        parse(bytes(message))


def test_missing_and_duplicate_body() -> None:
    only_sequence = op_msg({"x": 1}, {"documents": [{"a": 1}]})[16:]
    no_body = only_sequence[:4] + only_sequence[4 + len(bson.encode({"x": 1})) + 1:]
    with pytest.raises(wire.MessageError, match="no body"):
        wire.parse_message(wire.Header(16 + len(no_body), 1, 0, wire.OP_MSG), no_body)
    body = b"\x00" + bson.encode({"ping": 1})
    twice = struct.pack("<I", 0) + body + body
    with pytest.raises(wire.MessageError, match="more than one"):
        wire.parse_message(wire.Header(16 + len(twice), 1, 0, wire.OP_MSG), twice)


def test_replies_round_trip() -> None:
    doc = bson.encode({"ok": 1.0})
    reply = wire.op_msg_reply(42, doc)
    length, _, response_to, opcode = struct.unpack_from("<iiii", reply)
    assert (length, response_to, opcode) == (len(reply), 42, wire.OP_MSG)
    assert reply[21:] == doc
    legacy = wire.op_reply(9, doc, failure=True)
    assert struct.unpack_from("<i", legacy, 16)[0] == wire.QUERY_FAILURE
    assert legacy[36:] == doc


def _parse_or_refuse(message: bytes) -> None:
    """Parse arbitrary bytes as a message; only the two refusal types may escape."""
    try:
        header = wire.parse_header(message[:16])
        wire.parse_message(header, message[16:header.length])
    except (wire.FramingError, wire.MessageError):
        pass


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = [
    op_msg({"insert": "c", "ordered": True, "$db": "d"}, {"documents": [{"_id": 1, "s": "x"}]}),
    op_msg({"find": "c", "filter": {"a": {"$gt": 1}}, "$db": "d"}, checksum=True),
    op_query({"isMaster": 1, "client": {"driver": {"name": "x"}}}),
]


@FUZZ
@given(st.binary(min_size=0, max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    _parse_or_refuse(data)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_fuzz_mutated_messages(message: bytes, data: st.DataObject) -> None:
    mutated = bytearray(message)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    _parse_or_refuse(bytes(mutated[:cut]) if data.draw(st.booleans()) else bytes(mutated))


@FUZZ
@given(st.sampled_from(VALID), st.binary(min_size=1, max_size=64), st.integers(0, 400))
def test_fuzz_spliced_garbage(message: bytes, garbage: bytes, at: int) -> None:
    at = min(at, len(message))
    spliced = message[:at] + garbage + message[at:]
    fixed_length = struct.pack("<i", len(spliced)) + spliced[4:]
    _parse_or_refuse(fixed_length)
