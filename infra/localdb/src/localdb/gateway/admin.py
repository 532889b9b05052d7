"""Commands answered by the gateway itself: handshake, diagnostics, sessions, TTL.

The gateway presents itself as a standalone MongoDB 7.0 (wire version 21).
It omits `topologyVersion` from hello on purpose: drivers then poll instead
of holding a streaming (exhaust) hello open on every monitor connection.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from typing import Any

from localdb.gateway import wire
from localdb.gateway.context import Context, Handler, Reply

MAX_WIRE_VERSION = 21  # MongoDB 7.0
VERSION = "7.0.0"
MAX_WRITE_BATCH = 25_000  # the engine refuses larger batches; drivers split by this
EXPIRE_TTL_COMMAND = "localdbExpireTTL"
# The engine's TTL sweep, which pg_cron runs once a minute.
EXPIRE_TTL_SQL = b"CALL documentdb_api_internal.delete_expired_rows()"


def hello(ctx: Context) -> Reply:
    """hello / isMaster: what kind of server this is and its limits."""
    primary = "isWritablePrimary" if ctx.request.name == "hello" else "ismaster"
    reply: dict[str, Any] = {
        primary: True,
        "maxBsonObjectSize": wire.MAX_BSON_BYTES,
        "maxMessageSizeBytes": ctx.state.config.max_message_bytes,
        "maxWriteBatchSize": MAX_WRITE_BATCH,
        "localTime": dt.datetime.now(dt.UTC),
        "logicalSessionTimeoutMinutes": 30,
        "connectionId": ctx.client.connection_id,
        "minWireVersion": 0,
        "maxWireVersion": MAX_WIRE_VERSION,
        "readOnly": False,
        "ok": 1.0,
    }
    if ctx.body.get("helloOk"):
        reply["helloOk"] = True
    return reply


def ping(ctx: Context) -> Reply:
    """ping: the gateway answers; PostgreSQL is not consulted (as mongod's storage isn't)."""
    return {"ok": 1.0}


def build_info(ctx: Context) -> Reply:
    """buildInfo: the MongoDB version whose protocol is spoken."""
    return {"version": VERSION, "versionArray": [7, 0, 0, 0], "gitVersion": "localdb-gateway",
            "bits": 64, "maxBsonObjectSize": wire.MAX_BSON_BYTES, "modules": [],
            "storageEngines": ["documentdb"], "ok": 1.0}


def server_status(ctx: Context) -> Reply:
    """serverStatus: the few fields tools read."""
    return {"host": socket.gethostname(), "version": VERSION, "process": "localdb-gateway",
            "uptime": time.monotonic() - ctx.state.started,
            "localTime": dt.datetime.now(dt.UTC), "ok": 1.0}


def host_info(ctx: Context) -> Reply:
    """hostInfo."""
    return {"system": {"hostname": socket.gethostname()}, "os": {}, "extra": {}, "ok": 1.0}


def whats_my_uri(ctx: Context) -> Reply:
    """whatsmyuri."""
    return {"you": ctx.client.peer, "ok": 1.0}


def get_parameter(ctx: Context) -> Reply:
    """getParameter: only featureCompatibilityVersion is known."""
    return {"featureCompatibilityVersion": {"version": "7.0"}, "ok": 1.0}


def get_log(ctx: Context) -> Reply:
    """getLog: the gateway logs to stderr, not to a ring buffer."""
    return {"names": [], "log": [], "totalLinesWritten": 0, "ok": 1.0}


def connection_status(ctx: Context) -> Reply:
    """connectionStatus: no authentication, so nobody and everything."""
    return {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}, "ok": 1.0}


def get_cmd_line_opts(ctx: Context) -> Reply:
    """getCmdLineOpts."""
    config = ctx.state.config
    return {"argv": ["localdb-gateway"], "parsed": {
        "net": {"bindIp": config.host, "port": config.port}}, "ok": 1.0}


def end_sessions(ctx: Context) -> Reply:
    """endSessions: transactions those sessions left open are aborted."""
    sessions = ctx.body.get(ctx.request.name)
    keys = [bytes(s["id"]) for s in sessions or () if isinstance(s, dict) and "id" in s]
    ctx.state.transactions.end_sessions(keys)
    return {"ok": 1.0}


def acknowledge(ctx: Context) -> Reply:
    """Commands with nothing to do here (refreshSessions, killAllSessions, ...)."""
    return {"ok": 1.0}


def expire_ttl(ctx: Context) -> Reply:
    """localdbExpireTTL: run the engine's TTL sweep now, not at pg_cron's next minute.

    Tests use it to make expiry deterministic.
    """
    ctx.pg().execute(EXPIRE_TTL_SQL)
    return {"ok": 1.0}


HANDLERS: dict[str, Handler] = {
    "hello": hello,
    "isMaster": hello,
    "ismaster": hello,
    "ping": ping,
    "buildInfo": build_info,
    "buildinfo": build_info,
    "serverStatus": server_status,
    "hostInfo": host_info,
    "whatsmyuri": whats_my_uri,
    "getParameter": get_parameter,
    "getLog": get_log,
    "connectionStatus": connection_status,
    "getCmdLineOpts": get_cmd_line_opts,
    "endSessions": end_sessions,
    "killSessions": end_sessions,
    "refreshSessions": acknowledge,
    "killAllSessions": acknowledge,
    "getFreeMonitoringStatus": acknowledge,
    EXPIRE_TTL_COMMAND: expire_ttl,
}
