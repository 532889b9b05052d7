"""Single-operation throughput: pymongo -> gateway -> DocumentDB against direct SQL.

usage: python infra/localdb/bench/store_ops.py [--n 3000] [--repeat 3] [--uri URI] [--pg DSN]

For each operation the same workload runs in the same process, one operation
at a time: through pymongo and the gateway, and as direct calls of the
engine's SQL functions (psycopg, prepared statements, binary BSON, the same
BSON encoding/decoding a client needs). The table shows the median over
--repeat rounds and the ratio gateway/direct, both measured in this run.

What it needs it starts: without --pg (or env LOCALDB_PG_DSN) the local
DocumentDB is started if needed, as `python -m localdb start` would
(`localdb.ensure_started`, DocumentDB backend even when MONGODB_URI is set or
a mongod is on PATH, since the direct side needs its PostgreSQL), and its DSN
is used; it is left running like any `localdb start`. Without --uri a private
gateway subprocess is started on a free port against that DSN and stopped at
the end. Needs `pip install -e infra/localdb` (or PYTHONPATH=infra/localdb/src).

Three references put the ratio in context. "raw": the same commands sent to
the gateway by a minimal OP_MSG client (hand-built messages, one bson
encode/decode each, like the direct side), i.e. the gateway without a
driver's per-operation cost. "ceiling": the pymongo calls against a stub
server (a subprocess answering every command instantly with a canned reply),
i.e. what pymongo plus one loopback round trip allow before any gateway or
engine work. `ping`: the real gateway without the engine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import bson
import psycopg
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from pymongo import MongoClient, ReturnDocument
from pymongo.collection import Collection

from localdb import Config, LocalDBError, ensure_started
from localdb.documentdb import with_package

DB = "bench_store_ops"
WARMUP = 200

Op = Callable[[int], object]


def event(i: int) -> dict[str, Any]:
    """A document shaped like the service's stored events (~450 bytes of BSON)."""
    return {
        "idempotency_key": f"key-{i}-{uuid.uuid4().hex}",
        "event_day_id": 19700 + i % 30, "event_version": "v1", "event_type": "OR_MGMT",
        "event_status": "PENDING", "event_direction": "IN",
        "entity_metadata": {"partnerId": f"p{i % 7}", "partnerName": "Acme",
                            "entity_id": f"e{i}", "entity_type": "order"},
        "entity_data": {"orderId": i, "lines": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 1}],
                        "note": "x" * 120},
        "created": str(1_700_000_000_000 + i), "createdBy": "partner-eventbus", "attempts": 0,
    }


def upsert_key(i: int) -> str:
    """Keys for the upsert workload: each is inserted once, then updated."""
    return f"upsert-{i % 500}"


# -- direct SQL ---------------------------------------------------------------------------

class Bson(bytes):
    """Encoded BSON, sent as DocumentDB's `bson` type in binary format."""


def direct_connection(dsn: str) -> psycopg.Connection[Any]:
    """A psycopg connection that sends and receives `bson` as raw BSON bytes."""
    conn = psycopg.connect(dsn, autocommit=True)
    row = conn.execute("SELECT 'documentdb_core.bson'::regtype::oid").fetchone()
    assert row is not None
    oid = row[0]

    class BsonDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    class BsonLoader(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> bytes:
            return bytes(data)

    BsonDumper.oid = oid
    conn.adapters.register_dumper(Bson, BsonDumper)
    conn.adapters.register_loader(oid, BsonLoader)
    return conn


def direct_ops(conn: psycopg.Connection[Any], coll: str) -> dict[str, Op]:
    """The three operations as prepared calls of the engine's SQL API."""
    def call(sql: str, spec: dict[str, Any]) -> dict[str, Any]:
        row = conn.execute(sql, (DB, Bson(bson.encode(spec))), prepare=True,
                           binary=True).fetchone()
        assert row is not None
        return bson.decode(row[0])

    insert_sql = "SELECT p_result FROM documentdb_api.insert(%s, %s)"
    fam_sql = "SELECT p_result FROM documentdb_api.find_and_modify(%s, %s)"
    find_sql = "SELECT cursorpage FROM documentdb_api.find_cursor_first_page(%s, %s)"
    return {
        "insert_one": lambda i: call(insert_sql, {"insert": coll, "documents": [
            {"_id": bson.ObjectId(), **event(i)}]}),
        "find_one_and_update upsert": lambda i: call(fam_sql, {
            "findAndModify": coll, "query": {"idempotency_key": upsert_key(i)},
            "update": {"$inc": {"attempts": 1}, "$setOnInsert": {"event_status": "PENDING"}},
            "upsert": True, "new": False})["value"],
        "find_one by key": lambda i: call(find_sql, {
            "find": coll, "filter": {"idempotency_key": upsert_key(i)}, "limit": 1,
            "singleBatch": True})["cursor"]["firstBatch"],
    }


# -- through the gateway ------------------------------------------------------------------

def gateway_ops(coll: Collection[dict[str, Any]], client: MongoClient[Any]) -> dict[str, Op]:
    """The same operations through pymongo."""
    return {
        "insert_one": lambda i: coll.insert_one(event(i)),
        "find_one_and_update upsert": lambda i: coll.find_one_and_update(
            {"idempotency_key": upsert_key(i)},
            {"$inc": {"attempts": 1}, "$setOnInsert": {"event_status": "PENDING"}},
            upsert=True, return_document=ReturnDocument.BEFORE),
        "find_one by key": lambda i: coll.find_one({"idempotency_key": upsert_key(i)}),
        "ping": lambda i: client.admin.command("ping"),
    }


class RawClient:
    """A minimal OP_MSG client: the gateway's cost without a driver's."""

    def __init__(self, uri: str):
        host, port = re.match(r"mongodb://([^:/]+):(\d+)", uri).groups()  # type: ignore[union-attr]
        self._sock = socket.create_connection((host, int(port)))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lsid = {"id": bson.Binary(uuid.uuid4().bytes, 4)}

    def command(self, body: dict[str, Any],
                sequence: tuple[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """Send one command (documents as a kind-1 section if given); its reply."""
        payload = b"\x00\x00\x00\x00\x00" + bson.encode({**body, "lsid": self._lsid, "$db": DB})
        if sequence is not None:
            section = sequence[0].encode() + b"\x00" + b"".join(map(bson.encode, sequence[1]))
            payload += b"\x01" + struct.pack("<i", 4 + len(section)) + section
        self._sock.sendall(struct.pack("<iiii", 16 + len(payload), 1, 0, 2013) + payload)
        reply = self._read(struct.unpack("<i", self._read(4))[0] - 4)
        return bson.decode(reply[17:])

    def _read(self, count: int) -> bytes:
        """Exactly `count` bytes."""
        data = b""
        while len(data) < count:
            chunk = self._sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the gateway closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        """Disconnect."""
        self._sock.close()


def raw_ops(raw: RawClient, coll: str) -> dict[str, Op]:
    """The same operations as hand-built OP_MSG commands."""
    return {
        "insert_one": lambda i: raw.command({"insert": coll, "ordered": True}, (
            "documents", [{"_id": bson.ObjectId(), **event(i)}])),
        "find_one_and_update upsert": lambda i: raw.command({
            "findAndModify": coll, "query": {"idempotency_key": upsert_key(i)},
            "update": {"$inc": {"attempts": 1}, "$setOnInsert": {"event_status": "PENDING"}},
            "upsert": True, "new": False})["value"],
        "find_one by key": lambda i: raw.command({
            "find": coll, "filter": {"idempotency_key": upsert_key(i)}, "limit": 1,
            "singleBatch": True})["cursor"]["firstBatch"],
        "ping": lambda i: raw.command({"ping": 1}),
    }


@contextmanager
def gateway_process(dsn: str) -> Iterator[str]:
    """A gateway subprocess on a free port; yields its URI."""
    log = Path(tempfile.mkstemp(prefix="bench-gateway-", suffix=".log")[1])
    env = {**os.environ, "PYTHONPATH": with_package(os.environ.get("PYTHONPATH", ""))}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "localdb.gateway", "--listen",
                                 "127.0.0.1:0", "--pg", dsn],
                                stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, env=env)
    try:
        yield _wait_listening(proc, log)
    finally:
        proc.terminate()
        proc.wait(15)
        log.unlink(missing_ok=True)


def _wait_listening(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The URI once the gateway's log says where it listens."""
    pattern = re.compile(r"listening on (\S+):(\d+),")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        found = pattern.search(log.read_text(errors="replace"))
        if found:
            return f"mongodb://{found.group(1)}:{found.group(2)}/?directConnection=true"
        time.sleep(0.05)
    raise SystemExit(f"the gateway did not start:\n{log.read_text(errors='replace')}")


# -- the client ceiling: a stub server with canned replies ----------------------------------

STUB_REPLIES: dict[str, dict[str, Any]] = {
    "insert": {"n": 1, "ok": 1.0},
    "findAndModify": {"lastErrorObject": {"n": 1, "updatedExisting": True},
                      "value": {"_id": 1, "idempotency_key": "k", "attempts": 1}, "ok": 1.0},
    "find": {"cursor": {"id": bson.Int64(0), "ns": f"{DB}.c",
                        "firstBatch": [{"_id": 1, "idempotency_key": "k"}]}, "ok": 1.0},
}
HELLO = {"ismaster": True, "isWritablePrimary": True, "maxWireVersion": 21, "minWireVersion": 0,
         "maxBsonObjectSize": 16_777_216, "maxMessageSizeBytes": 48_000_000,
         "maxWriteBatchSize": 25_000, "logicalSessionTimeoutMinutes": 30, "ok": 1.0}


def stub_server() -> None:
    """Serve canned replies forever (run as `store_ops.py --stub-server`)."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening on 127.0.0.1:{listener.getsockname()[1]},", flush=True)
    encoded = {name: bson.encode(doc) for name, doc in STUB_REPLIES.items()}
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=_stub_connection, args=(sock, encoded), daemon=True).start()


def _stub_connection(sock: Any, encoded: dict[str, bytes]) -> None:
    """Answer each message on one connection: hello for handshakes, canned docs else."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    while len(head := reader.read(16)) == 16:
        length, request_id, _, opcode = struct.unpack("<iiii", head)
        payload = reader.read(length - 16)
        if opcode == 2004:  # OP_QUERY: the legacy handshake
            doc = bson.encode(HELLO)
            body = struct.pack("<iqii", 0, 0, 0, 1) + doc
            sock.sendall(struct.pack("<iiii", 16 + len(body), 0, request_id, 1) + body)
            continue
        size = struct.unpack_from("<i", payload, 5)[0]
        name = next(iter(bson.decode(payload[5:5 + size])))
        doc = encoded.get(name) or bson.encode(HELLO)
        body = b"\x00\x00\x00\x00\x00" + doc
        sock.sendall(struct.pack("<iiii", 16 + len(body), 0, request_id, 2013) + body)


@contextmanager
def stub_process() -> Iterator[str]:
    """The stub server in a subprocess (its own GIL); yields its URI."""
    log = Path(tempfile.mkstemp(prefix="bench-stub-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--stub-server"], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield _wait_listening(proc, log)
    finally:
        proc.kill()
        proc.wait(15)
        log.unlink(missing_ok=True)


# -- measuring ----------------------------------------------------------------------------

def rate(op: Op, n: int, start: int) -> float:
    """Operations per second of `op` over n calls (after a short warm-up)."""
    for i in range(start, start + WARMUP):
        op(i)
    began = time.perf_counter()
    for i in range(start + WARMUP, start + WARMUP + n):
        op(i)
    return n / (time.perf_counter() - began)


def prepare(client: MongoClient[Any], names: list[str]) -> None:
    """Fresh collections, each with the unique index the service uses."""
    client.drop_database(DB)
    for name in names:
        client[DB][name].create_index("idempotency_key", unique=True)


Rates = dict[str, dict[str, list[float]]]  # operation -> side -> ops/s per round


def measure(uri: str, stub_uri: str, dsn: str, n: int, repeat: int) -> Rates:
    """Each operation on each side, `repeat` rounds, sides interleaved within a round."""
    client: MongoClient[Any] = MongoClient(uri)
    stub: MongoClient[Any] = MongoClient(stub_uri)
    conn, raw = direct_connection(dsn), RawClient(uri)
    prepare(client, ["via_gateway", "via_raw", "direct"])
    sides = {"gateway": gateway_ops(client[DB]["via_gateway"], client),
             "raw": raw_ops(raw, "via_raw"),
             "direct": direct_ops(conn, "direct"),
             "ceiling": gateway_ops(stub[DB]["c"], stub)}
    rates: Rates = {name: {side: [] for side in sides} for name in sides["gateway"]}
    try:
        for round_ in range(repeat):
            start = round_ * (n + WARMUP)
            for name in rates:
                for side, ops in sides.items():
                    if name in ops:
                        rates[name][side].append(rate(ops[name], n, start))
    finally:
        client.drop_database(DB)
        for closable in (client, stub, conn, raw):
            closable.close()
    return rates


def table(rates: Rates, n: int, repeat: int) -> str:
    """The report: median ops/s per side and the ratios to direct SQL."""
    med = {name: {side: statistics.median(v) if v else None for side, v in sides.items()}
           for name, sides in rates.items()}
    lines = [f"median of {repeat} round(s) x {n} ops, one operation at a time (ops/s)",
             f"{'operation':<28}{'pymongo':>9}{'raw':>8}{'direct':>8}{'pymongo/':>10}"
             f"{'raw/':>7}{'ceiling':>9}",
             f"{'':<28}{'->gw':>9}{'->gw':>8}{'SQL':>8}{'direct':>10}{'direct':>7}"
             f"{'(stub)':>9}"]
    for name, m in med.items():
        cells = [_cell(m["gateway"], 9), _cell(m["raw"], 8), _cell(m["direct"], 8),
                 _ratio(m["gateway"], m["direct"], 10), _ratio(m["raw"], m["direct"], 7),
                 _cell(m["ceiling"], 9)]
        lines.append(f"{name:<28}" + "".join(cells))
    lines.append("pymongo->gw: the service's path; raw->gw: a minimal OP_MSG client; "
                 "ceiling: pymongo against a stub that answers instantly")
    return "\n".join(lines)


def _cell(value: float | None, width: int) -> str:
    """A right-aligned rate, or '-'."""
    return f"{value:>{width},.0f}" if value is not None else f"{'-':>{width}}"


def _ratio(value: float | None, base: float | None, width: int) -> str:
    """A right-aligned percentage, or '-'."""
    return f"{value / base:>{width}.0%}" if value and base else f"{'-':>{width}}"


def local_documentdb() -> str:
    """The DSN of the local DocumentDB's PostgreSQL, started (or provisioned) if needed."""
    config = replace(Config.from_env(), mongodb_uri=None, mongod=None)  # DocumentDB itself
    try:
        ensure_started(config)
    except LocalDBError as exc:
        raise SystemExit(f"store_ops: the local DocumentDB did not start: {exc}") from None
    return config.pg_dsn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="timed operations per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the median is shown)")
    parser.add_argument("--uri", help="use this running gateway instead of starting one")
    parser.add_argument("--pg", default=os.environ.get("LOCALDB_PG_DSN"),
                        help="PostgreSQL+DocumentDB DSN for the direct side and the gateway "
                             "(default: the local DocumentDB, started if needed)")
    parser.add_argument("--stub-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stub_server:
        stub_server()
    dsn = args.pg or local_documentdb()
    with stub_process() as stub_uri, (
            nullcontext(args.uri) if args.uri else gateway_process(dsn)) as uri:
        rates = measure(uri, stub_uri, dsn, args.n, args.repeat)
    print(table(rates, args.n, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
