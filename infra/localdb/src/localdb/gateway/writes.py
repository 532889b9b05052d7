"""insert, update, delete and findAndModify.

The hot path hands the command document and any document sequence to the
engine as raw bytes and, when the engine reports success, hands its reply
back the same way. Only a failed write is decoded, to map error codes, add
duplicate-key details, and retry upserts that lost a race.

Retries, as MongoDB's server does them, outside transactions only (inside
one, PostgreSQL has already aborted the transaction):
- Upserts: two concurrent upserts on the same unique key both find nothing
  and both insert; one gets a duplicate key. MongoDB retries such an upsert
  when its query is equalities on exactly the fields of the violated unique
  index (the retry finds and updates the winner's document); a query with
  any other condition gets its duplicate key at once (a conditional upsert
  of a document in another state: a retry would fail the same way).
- Write conflicts: a statement PostgreSQL chose as a deadlock victim (or
  that hit a serialization failure) did nothing; MongoDB retries write
  conflicts of single-document writes internally, so drivers never see them.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from localdb.gateway import dupkey, wire
from localdb.gateway.context import Context, Handler, Reply
from localdb.gateway.errors import Code, MongoError
from localdb.gateway.failures import IndexPatterns, describe_duplicates, from_pg, normalise
from localdb.gateway.pg import PgError, Statement, as_bool


def _write_statement(function: str) -> Statement:
    """`SELECT p_result, p_success FROM documentdb_api.<function>(db, spec, sequence)`."""
    return Statement(
        f"gw_{function}".encode(),
        f"SELECT p_result, p_success FROM documentdb_api.{function}("
        f"$1::text, $2::documentdb_core.bson, $3::documentdb_core.bsonsequence)".encode())


INSERT = _write_statement("insert")
UPDATE = _write_statement("update")
DELETE = _write_statement("delete")
FIND_AND_MODIFY = Statement(
    b"gw_find_and_modify",
    b"SELECT p_result, p_success FROM documentdb_api.find_and_modify("
    b"$1::text, $2::documentdb_core.bson)")

# Each command's document-sequence field; the engine takes the sequence as is.
SEQUENCE_FIELDS = {"insert": "documents", "update": "updates", "delete": "deletes"}
RETRY_ATTEMPTS = 10
_UPSERT_STRIPES = tuple(threading.Lock() for _ in range(64))


def insert(ctx: Context) -> Reply:
    """insert: duplicate keys are described from the inserted documents."""
    return _write_with_retries(ctx, INSERT, _as_document)


def update(ctx: Context) -> Reply:
    """update: lost upsert races and write conflicts are retried first."""
    statements = _statements(ctx)
    query = statements[0].get("q") if len(statements) == 1 and _is_upsert(statements[0]) else None
    with _single_flight(ctx, query):
        return _write_with_retries(ctx, UPDATE, dupkey.upsert_document)


def delete(ctx: Context) -> Reply:
    """delete: write conflicts are retried."""
    return _write_with_retries(ctx, DELETE, _as_document)


def _write_with_retries(ctx: Context, stmt: Statement,
                        document_of: Callable[[Any], Mapping[str, Any]]) -> Reply:
    """Run a write; on write errors retry what MongoDB would, then describe duplicates."""
    result = _write(ctx, stmt)
    if isinstance(result, dict):
        statements, patterns = _statements(ctx), IndexPatterns(ctx)
        if ctx.txn is None:
            result = _retry(ctx, stmt, statements, result, patterns)
        describe_duplicates(ctx, result, statements, document_of, patterns)
    return result


def _write(ctx: Context, stmt: Statement) -> Reply:
    """Run a write; the engine's reply as bytes on success, else decoded and normalised."""
    sequence = ctx.request.sequences.get(SEQUENCE_FIELDS[ctx.request.name])
    raw = sequence.raw if sequence is not None else None
    page, success = ctx.run(stmt, ctx.db_param, ctx.request.raw_body, raw)
    if as_bool(success) and page is not None:
        return page
    return normalise(wire.decode(page or b""))


def _statements(ctx: Context) -> list[Any]:
    """The command's documents / update or delete statements, decoded."""
    field = SEQUENCE_FIELDS[ctx.request.name]
    sequence = ctx.request.sequences.get(field)
    if sequence is not None:
        return sequence.documents
    statements = ctx.body.get(field)
    return statements if isinstance(statements, list) else []


def _is_upsert(statement: Any) -> bool:
    """True for an update statement with upsert: true."""
    return isinstance(statement, Mapping) and bool(statement.get("upsert"))


def _single_flight(ctx: Context, query: Any) -> AbstractContextManager[Any]:
    """Serialise this gateway's upserts of one query on one collection.

    DocumentDB enforces unique indexes with exclusion constraints, and
    concurrent inserts of one key into an exclusion constraint wait on each
    other: a deadlock, one victim per deadlock_timeout. Retried victims
    insert again and the cycle can last minutes. Letting one upsert of a given
    query run at a time makes the rest find the winner's document instead.
    Never inside a transaction: it may hold row locks a lock holder waits for.
    """
    if ctx.txn is not None or not isinstance(query, Mapping):
        return contextlib.nullcontext()
    key = hash((ctx.db, ctx.body.get(ctx.request.name), wire.encode(query)))
    return _UPSERT_STRIPES[key % len(_UPSERT_STRIPES)]


def _as_document(statement: Any) -> Mapping[str, Any]:
    """An inserted document is its own statement."""
    return statement if isinstance(statement, Mapping) else {}


def _retry(ctx: Context, stmt: Statement, statements: Sequence[Any], result: dict[str, Any],
           patterns: IndexPatterns) -> dict[str, Any]:
    """Re-run retryable failed statements (and, if ordered, those after), merging results."""
    ordered = ctx.body.get("ordered", True) is not False
    field = SEQUENCE_FIELDS[ctx.request.name]
    for attempt in range(1, RETRY_ATTEMPTS + 1):
        error = _retryable(result, statements, patterns)
        if error is None:
            break
        _back_off(attempt, error)
        index = error["index"]
        retry = list(statements[index:]) if ordered else [statements[index]]
        page, _ = ctx.run(stmt, ctx.db_param, wire.encode({**ctx.body, field: retry}), None)
        result = _merge(result, error, normalise(wire.decode(page or b"")), index)
    return result


def _retryable(result: Mapping[str, Any], statements: Sequence[Any],
               patterns: IndexPatterns) -> dict[str, Any] | None:
    """The first write error a retry can resolve: a write conflict or a lost upsert race."""
    for error in result.get("writeErrors") or ():
        index = error.get("index", -1)
        if not 0 <= index < len(statements):
            continue
        if error.get("code") == Code.WriteConflict:
            return dict(error)
        statement = statements[index]
        if (error.get("code") == Code.DuplicateKey and isinstance(statement, Mapping)
                and statement.get("upsert") and _pins(
                    statement.get("q"),
                    patterns.get(dupkey.index_from_message(error.get("errmsg", ""))))):
            return dict(error)
    return None


def _back_off(attempt: int, error: Mapping[str, Any]) -> None:
    """Before retrying a write conflict, wait a little (deadlock victims collide again)."""
    if error.get("code") == Code.WriteConflict:
        time.sleep(random.uniform(0, 0.005 * attempt))


def _pins(query: Any, pattern: Mapping[str, Any] | None) -> bool:
    """True when `query` is equalities on exactly the fields of the index key `pattern`.

    MongoDB's rule for retrying an upsert's duplicate key: the query is one
    equality or an AND of equalities, on the unique index's fields and no
    others. A query with any other condition (an upsert meant to insert only
    when a document is in some state) gets the duplicate key back at once:
    retrying it would find the same document in the same state.
    """
    if not isinstance(query, Mapping) or not pattern or not dupkey.only_equalities(query):
        return False
    return set(pattern) == set(dupkey.equality_fields(query))


def _merge(result: Mapping[str, Any], error: Mapping[str, Any], retry: Mapping[str, Any],
           offset: int) -> dict[str, Any]:
    """Combine a result with the retry of its statements from `offset` on."""
    merged = {k: v for k, v in result.items() if k not in ("writeErrors", "upserted")}
    for counter in ("n", "nModified"):
        if counter in result or counter in retry:
            merged[counter] = result.get(counter, 0) + retry.get(counter, 0)
    upserted = [*result.get("upserted", ()), *_shift(retry.get("upserted", ()), offset)]
    errors = [e for e in result.get("writeErrors", ()) if e.get("index") != error["index"]]
    errors += _shift(retry.get("writeErrors", ()), offset)
    if upserted:
        merged["upserted"] = sorted(upserted, key=lambda u: u["index"])
    if errors:
        merged["writeErrors"] = sorted(errors, key=lambda e: e["index"])
    return merged


def _shift(items: Sequence[Mapping[str, Any]], offset: int) -> list[dict[str, Any]]:
    """Renumber per-statement entries of a retried tail."""
    return [{**item, "index": item["index"] + offset} for item in items]


def find_and_modify(ctx: Context) -> Reply:
    """findAndModify, pipeline updates included; a lost upsert race is retried."""
    query = ctx.body.get("query", {}) if ctx.body.get("upsert") else None
    with _single_flight(ctx, query):
        return _find_and_modify(ctx)


def _find_and_modify(ctx: Context) -> Reply:
    """Run findAndModify, retrying what MongoDB would retry."""
    attempts = RETRY_ATTEMPTS if ctx.txn is None else 1
    for attempt in range(1, attempts + 1):
        try:
            page, success = ctx.run_raw(FIND_AND_MODIFY)
        except PgError as exc:
            error = from_pg(ctx, exc)
            if attempt == attempts or not _retry_find_and_modify(ctx, error):
                raise error from exc
            _back_off(attempt, {"code": error.code})
            continue
        if as_bool(success) and page is not None:
            return page
        return normalise(wire.decode(page or b""))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_find_and_modify(ctx: Context, error: MongoError) -> bool:
    """True for a write conflict, or an upsert's duplicate key on an index its query pins."""
    if error.code == Code.WriteConflict:
        return True
    pattern = error.extra.get("keyPattern")
    return (error.code == Code.DuplicateKey and bool(ctx.body.get("upsert"))
            and _pins(ctx.body.get("query"), pattern))


HANDLERS: dict[str, Handler] = {
    "insert": insert,
    "update": update,
    "delete": delete,
    "findAndModify": find_and_modify,
    "findandmodify": find_and_modify,
}
