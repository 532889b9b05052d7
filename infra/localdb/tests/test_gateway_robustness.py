"""Hostile and unusual input over a real socket: the gateway answers or hangs up, and
keeps serving everyone else."""

from __future__ import annotations

import contextlib
import socket
import struct

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from localdb.gateway import wire
from localdb_support import GatewayProcess
from test_gateway_wire import VALID, op_msg, op_query


def connect(gateway: GatewayProcess) -> socket.socket:
    sock = socket.create_connection((gateway.host, gateway.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_reply(sock: socket.socket) -> tuple[int, bytes] | None:
    """(opcode, body) of one reply, or None if the gateway closed the connection."""
    head = _read(sock, 16)
    if head is None:
        return None
    length, _, _, opcode = struct.unpack("<iiii", head)
    body = _read(sock, length - 16)
    return None if body is None else (opcode, body)


def _read(sock: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def reply_document(reply: tuple[int, bytes]) -> dict:
    opcode, body = reply
    offset = 5 if opcode == wire.OP_MSG else 20
    return bson.decode(body[offset:])


def assert_serving(gateway: GatewayProcess) -> None:
    """A brand-new client can still talk to the gateway."""
    client = gateway.client(serverSelectionTimeoutMS=3000)
    try:
        assert client.admin.command("ping")["ok"] == 1.0
    finally:
        client.close()
    assert gateway.proc.poll() is None, gateway.log()


def exchange(gateway: GatewayProcess, data: bytes) -> tuple[int, bytes] | None:
    with connect(gateway) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return read_reply(sock)


def test_garbage_bytes_close_the_connection(gateway: GatewayProcess) -> None:
    assert exchange(gateway, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") is None
    assert exchange(gateway, b"\xff" * 64) is None
    assert_serving(gateway)


def test_truncated_message_then_disconnect(gateway: GatewayProcess) -> None:
    message = op_msg({"ping": 1, "$db": "admin"})
    for cut in (3, 16, len(message) - 1):
        assert exchange(gateway, message[:cut]) is None
    assert_serving(gateway)


def test_oversized_length_is_refused_without_reading_it(gateway: GatewayProcess) -> None:
    header = struct.pack("<iiii", 49_000_000, 1, 0, wire.OP_MSG)
    assert exchange(gateway, header + b"\x00" * 100) is None
    assert_serving(gateway)


def test_unknown_opcode_gets_an_error_reply(gateway: GatewayProcess) -> None:
    payload = b"\x00" * 12
    reply = exchange(gateway, struct.pack("<iiii", 16 + len(payload), 5, 0, 2002) + payload)
    assert reply is not None and reply_document(reply)["ok"] == 0.0
    assert_serving(gateway)


def test_bad_bson_gets_an_error_and_the_connection_lives_on(gateway: GatewayProcess) -> None:
    bad = bytearray(op_msg({"ping": 1, "$db": "admin"}))
    bad[16 + 5 + 4] = 0x20  # not a BSON type
    with connect(gateway) as sock:
        sock.sendall(bytes(bad))
        error = reply_document(read_reply(sock))
        assert error["ok"] == 0.0 and error["code"] == 22
        sock.sendall(op_msg({"ping": 1, "$db": "admin"}))
        assert reply_document(read_reply(sock))["ok"] == 1.0


def test_legacy_op_query_handshake(gateway: GatewayProcess) -> None:
    with connect(gateway) as sock:
        sock.sendall(op_query({"isMaster": 1}))
        opcode, body = read_reply(sock)
        assert opcode == wire.OP_REPLY
        assert reply_document((opcode, body))["ismaster"] is True
        sock.sendall(op_query({"find": "c"}, namespace="db.$cmd"))
        opcode, body = read_reply(sock)
        assert struct.unpack_from("<i", body)[0] & wire.QUERY_FAILURE
        assert reply_document((opcode, body))["code"] == 352


def test_checksum_and_more_to_come(gateway: GatewayProcess, gw_db: Database) -> None:
    with connect(gateway) as sock:
        sock.sendall(op_msg({"ping": 1, "$db": "admin"}, checksum=True))
        assert reply_document(read_reply(sock))["ok"] == 1.0
        fire_and_forget = op_msg({"insert": "c", "$db": gw_db.name},
                                 {"documents": [{"_id": 1}]}, flags=wire.MORE_TO_COME)
        sock.sendall(fire_and_forget + op_msg({"count": "c", "$db": gw_db.name}))
        assert reply_document(read_reply(sock))["n"] == 1  # the first got no reply


def test_change_streams_are_not_supported(gw_db: Database, gw_client: MongoClient) -> None:
    with pytest.raises(OperationFailure) as caught:
        gw_db.events.watch()
    assert caught.value.code == 115
    assert caught.value.details["codeName"] == "CommandNotSupported"
    with pytest.raises(OperationFailure) as caught:
        gw_client.watch()
    assert caught.value.code == 115


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(VALID), st.data())
def test_fuzz_live_gateway(gateway: GatewayProcess, message: bytes, data: st.DataObject) -> None:
    mutated = bytearray(message)
    for _ in range(data.draw(st.integers(1, 6))):
        mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
    extra = data.draw(st.binary(max_size=32))
    with contextlib.suppress(OSError):  # a reset is a fine answer to garbage
        exchange(gateway, bytes(mutated) + extra)
    assert gateway.proc.poll() is None, gateway.log()


def test_still_serving_after_the_fuzzing(gateway: GatewayProcess) -> None:
    assert_serving(gateway)
