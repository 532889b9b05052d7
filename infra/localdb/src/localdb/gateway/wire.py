"""MongoDB wire protocol: framing, OP_MSG and OP_QUERY parsing, reply encoding.

Nothing here touches a socket or the database: functions take bytes and return
a parsed `Request` or encoded reply bytes, so the parser can be fuzzed alone.
Two failure kinds: `FramingError` means the byte stream can no longer be
trusted (close the connection); `MessageError` means one well-framed message
was refused (answer it with an error and keep serving).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion

from localdb.gateway.errors import Code, MongoError

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

HEADER = struct.Struct("<iiii")
HEADER_BYTES = HEADER.size
MAX_MESSAGE_BYTES = 48_000_000
MAX_BSON_BYTES = 16 * 1024 * 1024
# The server accepts command documents slightly over 16 MB: room for the
# command's own fields around a maximum-size user document.
MAX_COMMAND_BYTES = MAX_BSON_BYTES + 16 * 1024

CHECKSUM_PRESENT = 1 << 0
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
# Bits 0-15 are "required": a receiver must refuse any it does not know.
_UNKNOWN_REQUIRED_FLAGS = 0xFFFF & ~(CHECKSUM_PRESENT | MORE_TO_COME)
QUERY_FAILURE = 1 << 1  # OP_REPLY responseFlags bit

HANDSHAKE_COMMANDS = frozenset({"hello", "isMaster", "ismaster"})

CODEC = CodecOptions(
    document_class=dict,
    tz_aware=True,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)

_INT32 = struct.Struct("<i")
_UINT32 = struct.Struct("<I")
_OP_QUERY_FIXED = struct.Struct("<ii")  # numberToSkip, numberToReturn
_OP_REPLY_FIXED = struct.Struct("<iqii")  # responseFlags, cursorID, startingFrom, numberReturned
_OP_MSG_BODY_PREFIX = b"\x00\x00\x00\x00\x00"  # flagBits 0, section kind 0
_reply_ids = itertools.count(1)


class FramingError(Exception):
    """The stream is not MongoDB wire protocol any more: the connection must close."""


class MessageError(Exception):
    """A well-framed message the gateway refuses; answered with an error document."""

    def __init__(self, message: str, code: Code = Code.FailedToParse, legacy: bool = False):
        super().__init__(message)
        self.code = code
        self.legacy = legacy  # reply as OP_REPLY: the client sent OP_QUERY


@dataclass(frozen=True, slots=True)
class Header:
    """The 16-byte message header."""

    length: int
    request_id: int
    response_to: int
    opcode: int

    def to_bytes(self) -> bytes:
        """The header exactly as it was received (the checksum covers it)."""
        return HEADER.pack(self.length, self.request_id, self.response_to, self.opcode)


@dataclass(frozen=True, slots=True)
class DocumentSequence:
    """A kind-1 section: the raw documents for the engine, decoded ones for the gateway."""

    raw: bytes
    documents: list[dict[str, Any]]


@dataclass(slots=True)
class Request:
    """One command as the gateway sees it, whichever opcode carried it."""

    request_id: int
    body: dict[str, Any]
    raw_body: bytes  # the command document's own bytes, handed to the engine unchanged
    sequences: dict[str, DocumentSequence] = field(default_factory=dict)
    more_to_come: bool = False
    legacy: bool = False

    @property
    def name(self) -> str:
        """The command name: the body's first key."""
        return next(iter(self.body))

    @property
    def db(self) -> str:
        """The database the command runs against."""
        db = self.body.get("$db", "admin")
        if not isinstance(db, str) or not db:
            raise MongoError(Code.InvalidNamespace, "$db must be a non-empty string")
        return db


def parse_header(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Header:
    """Decode and bound-check a header; `FramingError` if its length is impossible."""
    if len(data) != HEADER_BYTES:
        raise FramingError(f"truncated header: {len(data)} bytes")
    header = Header(*HEADER.unpack(data))
    if not HEADER_BYTES < header.length <= max_bytes:
        raise FramingError(f"message length {header.length} outside 17..{max_bytes}")
    return header


def parse_message(header: Header, payload: bytes) -> Request:
    """Parse the bytes after the header into a `Request`, or raise `MessageError`."""
    if header.opcode == OP_MSG:
        return parse_op_msg(header, payload)
    if header.opcode == OP_QUERY:
        return parse_op_query(header.request_id, payload)
    raise MessageError(f"unsupported opcode {header.opcode}", Code.CommandNotSupported)


def parse_op_msg(header: Header, payload: bytes) -> Request:
    """OP_MSG: flag bits, one body section, any document sequences, optional CRC-32C."""
    if len(payload) < 5:
        raise MessageError("OP_MSG too short")
    flags = _UINT32.unpack_from(payload)[0]
    if flags & _UNKNOWN_REQUIRED_FLAGS:
        raise MessageError(f"OP_MSG has unknown required flag bits: {flags:#x}")
    end = len(payload)
    if flags & CHECKSUM_PRESENT:
        end -= 4
        _verify_checksum(header, payload, end)
    raw_body, sequences = _sections(payload, 4, end)
    return Request(
        request_id=header.request_id,
        body=_decode_command(raw_body),
        raw_body=raw_body,
        sequences=sequences,
        more_to_come=bool(flags & MORE_TO_COME),
    )


def _verify_checksum(header: Header, payload: bytes, end: int) -> None:
    """Refuse the message when its trailing CRC-32C does not match its bytes."""
    if end < 5:
        raise MessageError("OP_MSG too short for its checksum")
    expected = _UINT32.unpack_from(payload, end)[0]
    if crc32c(header.to_bytes() + payload[:end]) != expected:
        raise MessageError("OP_MSG checksum mismatch")


def _sections(payload: bytes, pos: int,
              end: int) -> tuple[bytes, dict[str, DocumentSequence]]:
    """Split OP_MSG sections: exactly one kind-0 body, any kind-1 sequences."""
    body: bytes | None = None
    sequences: dict[str, DocumentSequence] = {}
    while pos < end:
        kind = payload[pos]
        if kind == 0:
            if body is not None:
                raise MessageError("OP_MSG has more than one body section")
            body = _document_at(payload, pos + 1, end, MAX_COMMAND_BYTES)
            pos += 1 + len(body)
        elif kind == 1:
            name, docs, pos = _sequence_at(payload, pos + 1, end)
            if name in sequences:
                raise MessageError(f"duplicate document sequence {name!r}")
            sequences[name] = docs
        else:
            raise MessageError(f"unknown OP_MSG section kind {kind}")
    if body is None:
        raise MessageError("OP_MSG has no body section")
    return body, sequences


def _document_at(data: bytes, pos: int, end: int, limit: int = MAX_BSON_BYTES) -> bytes:
    """The bytes of the BSON document starting at `pos`, after framing checks only."""
    if pos + 5 > end:
        raise MessageError("truncated BSON document", Code.InvalidBSON)
    size = _INT32.unpack_from(data, pos)[0]
    if size < 5 or pos + size > end or size > limit:
        raise MessageError(f"bad BSON document length {size}", Code.InvalidBSON)
    return data[pos : pos + size]


def _sequence_at(data: bytes, pos: int, end: int) -> tuple[str, DocumentSequence, int]:
    """A kind-1 section: (identifier, its documents, next position)."""
    if pos + 4 > end:
        raise MessageError("truncated document sequence")
    size = _INT32.unpack_from(data, pos)[0]
    stop = pos + size
    if size < 5 or stop > end:
        raise MessageError(f"bad document sequence length {size}")
    name, start = read_cstring(data, pos + 4, stop)
    raw = data[start:stop]
    return name, DocumentSequence(raw, decode_sequence(raw)), stop


def decode_sequence(raw: bytes) -> list[dict[str, Any]]:
    """Decode a run of documents, refusing it unless every one is well-formed BSON.

    The engine receives these bytes unchanged, so they are checked here (a
    malformed document must never reach a PostgreSQL backend): one C-level
    decode of the whole run, which also checks the documents' framing.
    """
    try:
        return list(bson.decode_all(raw, CODEC))
    except Exception as exc:  # the C decoder raises several types for bad input
        raise MessageError(f"invalid BSON in document sequence: {exc}", Code.InvalidBSON) from exc


def read_cstring(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at `pos`: (text, position after the NUL)."""
    stop = data.find(b"\x00", pos, end)
    if stop < 0:
        raise MessageError("unterminated string")
    try:
        return data[pos:stop].decode("utf-8"), stop + 1
    except UnicodeDecodeError as exc:
        raise MessageError("string is not UTF-8") from exc


def _decode_command(raw: bytes) -> dict[str, Any]:
    """Decode a command document and require a command name."""
    try:
        body: dict[str, Any] = bson.decode(raw, CODEC)
    except Exception as exc:  # the C decoder raises several types for bad input
        raise MessageError(f"invalid BSON: {exc}", Code.InvalidBSON) from exc
    if not body:
        raise MessageError("empty command document")
    return body


def parse_op_query(request_id: int, payload: bytes) -> Request:
    """Legacy OP_QUERY: only the connection handshake (hello / isMaster) is served."""
    try:
        return _parse_op_query(request_id, payload)
    except MessageError as exc:
        exc.legacy = True  # the client reads OP_REPLY, so answer in kind
        raise


def _parse_op_query(request_id: int, payload: bytes) -> Request:
    """OP_QUERY fields: flags, namespace, skip, limit, query document."""
    pos = _INT32.size  # flags: nothing in them matters for a command
    namespace, pos = read_cstring(payload, pos, len(payload))
    pos += _OP_QUERY_FIXED.size
    raw = _document_at(payload, pos, len(payload), MAX_COMMAND_BYTES)
    if not namespace.endswith(".$cmd"):
        raise MessageError("OP_QUERY is only supported for commands",
                           Code.UnsupportedOpQueryCommand)
    body = _unwrap(_decode_command(raw))
    if next(iter(body)) not in HANDSHAKE_COMMANDS:
        raise MessageError("Unsupported OP_QUERY command; use OP_MSG",
                           Code.UnsupportedOpQueryCommand)
    body["$db"] = namespace[: -len(".$cmd")]
    return Request(request_id=request_id, body=body, raw_body=raw, legacy=True)


def _unwrap(body: dict[str, Any]) -> dict[str, Any]:
    """Old drivers wrap the command as {$query: command, $readPreference: ...}."""
    inner = body.get("$query", body.get("query"))
    if next(iter(body)) in ("$query", "query") and isinstance(inner, dict) and inner:
        return inner
    return body


def encode(document: Mapping[str, Any]) -> bytes:
    """BSON-encode a reply document with the gateway's codec options."""
    return bson.encode(document, codec_options=CODEC)


def decode(data: bytes) -> dict[str, Any]:
    """Decode a BSON document returned by the engine."""
    result: dict[str, Any] = bson.decode(data, CODEC)
    return result


def op_msg_reply(response_to: int, document: bytes) -> bytes:
    """An OP_MSG reply: header, no flags, one body section."""
    length = HEADER_BYTES + len(_OP_MSG_BODY_PREFIX) + len(document)
    return (HEADER.pack(length, next(_reply_ids), response_to, OP_MSG)
            + _OP_MSG_BODY_PREFIX + document)


def op_reply(response_to: int, document: bytes, failure: bool = False) -> bytes:
    """A legacy OP_REPLY carrying one document (QueryFailure set for errors)."""
    fixed = _OP_REPLY_FIXED.pack(QUERY_FAILURE if failure else 0, 0, 0, 1)
    length = HEADER_BYTES + len(fixed) + len(document)
    return HEADER.pack(length, next(_reply_ids), response_to, OP_REPLY) + fixed + document


def _crc32c_table() -> tuple[int, ...]:
    """The 256-entry table of the reflected Castagnoli polynomial."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of `data`. Pure Python: drivers rarely send checksums, so speed is moot."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
