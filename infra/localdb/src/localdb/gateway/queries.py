"""Reads: find, aggregate, getMore, killCursors, count, distinct, listCollections, listIndexes.

First pages come from the engine's `*_cursor_first_page` functions. When a
cursor stays open, the engine returns a continuation document to pass to
`cursor_get_more`; if it also says "persist connection", the cursor's state
lives in that PostgreSQL session, which then stays with the cursor. Past a
limit on such cursors, a new one is read to the end at once and served from
memory, so that open cursors can never use up PostgreSQL's sessions.
"""

from __future__ import annotations

import json
from typing import Any

from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from localdb.gateway import wire
from localdb.gateway.context import Context, Handler, Reply
from localdb.gateway.errors import Code, MongoError
from localdb.gateway.pg import Statement, as_bool, as_int8
from localdb.gateway.sessions import Cursor


def _first_page_statement(function: str) -> Statement:
    """`SELECT cursorpage, continuation, persistconnection, cursorid FROM <function>(...)`."""
    return Statement(
        f"gw_{function}".encode(),
        f"SELECT cursorpage, continuation, persistconnection, cursorid "
        f"FROM documentdb_api.{function}($1::text, $2::documentdb_core.bson)".encode())


def _document_statement(function: str) -> Statement:
    """`SELECT document FROM <function>(db, spec)`: one reply document."""
    return Statement(
        f"gw_{function}".encode(),
        f"SELECT document FROM documentdb_api.{function}("
        f"$1::text, $2::documentdb_core.bson)".encode())


FIND = _first_page_statement("find_cursor_first_page")
AGGREGATE = _first_page_statement("aggregate_cursor_first_page")
LIST_COLLECTIONS = _first_page_statement("list_collections_cursor_first_page")
LIST_INDEXES = _first_page_statement("list_indexes_cursor_first_page")
COUNT = _document_statement("count_query")
DISTINCT = _document_statement("distinct_query")
DRAIN_BATCH = 10_000
BUFFERED_PAGE_BYTES = 8 * 1024 * 1024
_EMPTY_PAGE = wire.encode({"cursor": {"id": 0, "nextBatch": []}})
GET_MORE = Statement(
    b"gw_get_more",
    b"SELECT cursorpage, continuation FROM documentdb_api.cursor_get_more("
    b"$1::text, $2::documentdb_core.bson, $3::documentdb_core.bson)")


def find(ctx: Context) -> Reply:
    """find."""
    return first_page(ctx, FIND)


def aggregate(ctx: Context) -> Reply:
    """aggregate; change streams are refused up front (the engine has none)."""
    pipeline = ctx.body.get("pipeline")
    if isinstance(pipeline, list) and any(
            isinstance(stage, dict) and "$changeStream" in stage for stage in pipeline):
        raise MongoError(Code.CommandNotSupported,
                         "$changeStream is not supported: DocumentDB has no change streams")
    return first_page(ctx, AGGREGATE)


def list_collections(ctx: Context) -> Reply:
    """listCollections."""
    return first_page(ctx, LIST_COLLECTIONS)


def list_indexes(ctx: Context) -> Reply:
    """listIndexes."""
    return first_page(ctx, LIST_INDEXES)


def first_page(ctx: Context, stmt: Statement) -> Reply:
    """Run a first-page function; remember the cursor if it stays open."""
    page, continuation, persisted, cursor_id = ctx.run_raw(stmt)
    number = as_int8(cursor_id)
    if not number or continuation is None or page is None:
        return page or b""
    cursors = ctx.state.cursors
    if not as_bool(persisted) or ctx.txn is not None:
        cursors.add(Cursor(number, continuation, txn=ctx.txn))
    elif cursors.try_pin():
        cursors.add(Cursor(number, continuation, pinned=ctx.detach()))
    else:
        cursors.add(_drained(ctx, page, number, continuation))
    return page


def _drained(ctx: Context, page: bytes, cursor_id: int, continuation: bytes) -> Cursor:
    """Read a persisted cursor to the end now, so that it needs no session later."""
    namespace = RawBSONDocument(page)["cursor"]["ns"]
    spec = wire.encode({"getMore": Int64(cursor_id), "collection": namespace.split(".", 1)[1],
                        "batchSize": DRAIN_BATCH})
    documents: list[RawBSONDocument] = []
    while True:
        next_page, next_continuation = ctx.run(GET_MORE, ctx.db_param, spec, continuation)
        cursor = RawBSONDocument(next_page or _EMPTY_PAGE)["cursor"]
        documents.extend(cursor["nextBatch"])
        if not cursor["id"] or next_continuation is None:
            return Cursor(cursor_id, b"", buffered=documents, namespace=namespace)
        continuation = next_continuation


def get_more(ctx: Context) -> Reply:
    """getMore, from the engine or from memory; the cursor closes when exhausted."""
    cursor_id, batch_size = _get_more_arguments(ctx.body)
    cursor = ctx.state.cursors.checkout(cursor_id)
    if cursor.buffered is not None:
        return _buffered_page(ctx, cursor, batch_size)
    return _engine_page(ctx, cursor)


def _get_more_arguments(body: dict[str, Any]) -> tuple[int, int]:
    """(cursor id, batchSize or 0), checked: a bad value must not strand a cursor."""
    cursor_id, batch_size = body.get("getMore"), body.get("batchSize", 0)
    if not isinstance(cursor_id, int) or isinstance(cursor_id, bool):
        raise MongoError(Code.TypeMismatch, "getMore must be a 64-bit cursor id")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 0:
        raise MongoError(Code.BadValue, "batchSize must be a non-negative integer")
    return cursor_id, batch_size


def _engine_page(ctx: Context, cursor: Cursor) -> Reply:
    """The next page of a cursor the engine holds."""
    cursors = ctx.state.cursors
    try:
        page, continuation = _next_page(ctx, cursor)
    except BaseException:
        cursors.finish(cursor, kill=True)
        raise
    if page is None or cursor_exhausted(page):
        cursors.finish(cursor)
    else:
        cursor.continuation = continuation or cursor.continuation
        cursors.checkin(cursor)
    return page or b""


def _next_page(ctx: Context, cursor: Cursor) -> tuple[bytes | None, bytes | None]:
    """Run cursor_get_more where the cursor lives."""
    if cursor.txn is not None and cursor.txn is not ctx.txn:
        raise MongoError(Code.CursorNotFound,
                         f"cursor id {cursor.cursor_id} belongs to another transaction")
    conn = cursor.pinned or ctx.pg()
    page, continuation = conn.run(GET_MORE, (ctx.db_param, ctx.request.raw_body,
                                             cursor.continuation))
    return page, continuation


def _buffered_page(ctx: Context, cursor: Cursor, batch_size: int) -> Reply:
    """The next batch of a cursor held in memory, at most batchSize docs and ~8 MB."""
    remaining = cursor.buffered or []
    limit = batch_size or len(remaining)
    count, size = 0, 0
    while count < min(limit, len(remaining)) and (count == 0 or size < BUFFERED_PAGE_BYTES):
        size += len(remaining[count].raw)
        count += 1
    batch, cursor.buffered = remaining[:count], remaining[count:]
    done = not cursor.buffered
    if done:
        ctx.state.cursors.finish(cursor)
    else:
        ctx.state.cursors.checkin(cursor)
    return {"cursor": {"id": Int64(0 if done else cursor.cursor_id), "ns": cursor.namespace,
                       "nextBatch": batch}, "ok": 1.0}


def cursor_exhausted(page: bytes) -> bool:
    """True when a cursor page reports id 0; decodes only the small `cursor` header."""
    cursor = RawBSONDocument(page).get("cursor")
    return not isinstance(cursor, RawBSONDocument) or not cursor.get("id")


def kill_cursors(ctx: Context) -> Reply:
    """killCursors."""
    ids = ctx.body.get("cursors")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise MongoError(Code.TypeMismatch, "cursors must be an array of cursor ids")
    killed, missing = ctx.state.cursors.kill(ids)
    return {"cursorsKilled": killed, "cursorsNotFound": missing, "cursorsAlive": [],
            "cursorsUnknown": [], "ok": 1.0}


def count(ctx: Context) -> Reply:
    """count."""
    return _document(ctx, COUNT)


def distinct(ctx: Context) -> Reply:
    """distinct."""
    return _document(ctx, DISTINCT)


def _document(ctx: Context, stmt: Statement) -> Reply:
    """A command whose engine function returns the reply document itself."""
    return ctx.run_raw(stmt)[0] or b""


# explain: PostgreSQL's plan of the engine's query function for the command.
EXPLAINED = {"find": "bson_aggregation_find", "aggregate": "bson_aggregation_pipeline",
             "count": "bson_aggregation_count", "distinct": "bson_aggregation_distinct"}


def explain(ctx: Context) -> Reply:
    """explain of find / aggregate / count / distinct: the PostgreSQL plan, as JSON.

    Index names in the plan are the engine's ("documents_rum_index_<id>"), not MongoDB's.
    """
    command = ctx.body.get("explain")
    kind = next(iter(command), None) if isinstance(command, dict) else None
    if kind not in EXPLAINED or not isinstance(command, dict):
        raise MongoError(Code.CommandNotSupported, f"explain of {kind!r} is not supported")
    stmt = Statement(f"gw_explain_{kind}".encode(),
                     f"EXPLAIN (FORMAT JSON) SELECT document FROM documentdb_api_catalog."
                     f"{EXPLAINED[kind]}($1::text, $2::documentdb_core.bson)".encode())
    plan = json.loads(ctx.run(stmt, ctx.db_param, wire.encode(command))[0] or b"[{}]")
    return {"queryPlanner": {"namespace": f"{ctx.db}.{command[kind]}",
                             "winningPlan": {"stage": "POSTGRESQL", "plan": plan[0].get("Plan")},
                             "rejectedPlans": []},
            "command": command, "ok": 1.0}


HANDLERS: dict[str, Handler] = {
    "explain": explain,
    "find": find,
    "aggregate": aggregate,
    "getMore": get_more,
    "killCursors": kill_cursors,
    "count": count,
    "distinct": distinct,
    "listCollections": list_collections,
    "listIndexes": list_indexes,
}
