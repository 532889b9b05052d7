"""Turning engine failures into the errors MongoDB drivers expect.

Handles the two places a failure can surface: a PostgreSQL error raised by a
statement (command-level), and the `writeErrors` array of a write result
(per statement, with codes packed as int32 SQLSTATEs). Duplicate keys get
`keyPattern` / `keyValue`, looked up from the collection's indexes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from localdb.gateway import dupkey, wire
from localdb.gateway.context import Context
from localdb.gateway.errors import Code, MongoError, code_for_engine_int, code_for_sqlstate
from localdb.gateway.pg import PgConnection, PgError, Statement

LIST_INDEXES = Statement(
    b"gw_index_patterns",
    b"SELECT cursorpage FROM documentdb_api.list_indexes_cursor_first_page("
    b"$1::text, $2::documentdb_core.bson)")


def collection_of(ctx: Context) -> str:
    """The collection a command names (its first value), or "" for database commands."""
    value = ctx.body.get(ctx.request.name)
    return value if isinstance(value, str) else ""


def namespace_of(ctx: Context) -> str:
    """"db.collection" for messages."""
    return f"{ctx.db}.{collection_of(ctx)}"


class IndexPatterns:
    """A collection's index key patterns by name, fetched once and only when needed."""

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self._by_name: dict[str, dict[str, Any]] | None = None

    def by_name(self) -> dict[str, dict[str, Any]]:
        """{index name: key pattern}; empty when the lookup itself fails."""
        if self._by_name is None:
            try:
                self._by_name = self._ctx.with_lookup_session(self._fetch)
            except (PgError, MongoError):
                self._by_name = {}
        return self._by_name

    def _fetch(self, conn: PgConnection) -> dict[str, dict[str, Any]]:
        """Read the index list through the engine's listIndexes."""
        spec = wire.encode({"listIndexes": collection_of(self._ctx),
                            "cursor": {"batchSize": 10_000}})
        page = wire.decode(conn.run(LIST_INDEXES, (self._ctx.db_param, spec))[0] or b"")
        return {ix["name"]: ix["key"] for ix in page["cursor"]["firstBatch"]}

    def get(self, name: str | None) -> dict[str, Any] | None:
        """The key pattern of index `name`."""
        if name == "_id_":
            return {"_id": 1}
        return self.by_name().get(name) if name else None

    def name_for(self, pattern: Mapping[str, Any]) -> str:
        """The name of the index with key `pattern` (MongoDB's default name if unknown)."""
        wanted = list(pattern.items())
        for name, key in self.by_name().items():
            if list(key.items()) == wanted:
                return name
        return dupkey.default_index_name(pattern)


def from_pg(ctx: Context, exc: PgError) -> MongoError:
    """The MongoDB error for a PostgreSQL/engine error raised by a command."""
    code = code_for_sqlstate(exc.sqlstate)
    if code == Code.DuplicateKey:
        duplicate = _duplicate_from_detail(ctx, exc.detail)
        if duplicate is not None:
            return duplicate
    return MongoError(code, exc.message)


def _duplicate_from_detail(ctx: Context, detail: str | None) -> MongoError | None:
    """A DuplicateKey error with details, when the violation's DETAIL can be parsed."""
    parsed = dupkey.parse_detail(detail)
    if parsed is None:
        return None
    pattern, doc = parsed
    name = IndexPatterns(ctx).name_for(pattern)
    return dupkey.duplicate_key_error(namespace_of(ctx), name, pattern,
                                      dupkey.key_value(pattern, doc))


def normalise(result: dict[str, Any]) -> dict[str, Any]:
    """Map packed write-error codes to MongoDB codes and make `ok` a double."""
    for error in result.get("writeErrors") or ():
        if isinstance(error.get("code"), int):
            error["code"] = code_for_engine_int(error["code"])
    if "ok" in result:
        result["ok"] = float(result["ok"])
    return result


def describe_duplicates(ctx: Context, result: dict[str, Any], statements: Sequence[Any],
                        document_of: Callable[[Any], Mapping[str, Any]],
                        patterns: IndexPatterns) -> None:
    """Give each duplicate-key write error MongoDB's message, keyPattern and keyValue."""
    for error in result.get("writeErrors") or ():
        if error.get("code") != Code.DuplicateKey:
            continue
        name = dupkey.index_from_message(error.get("errmsg", ""))
        pattern = patterns.get(name)
        index = error.get("index", -1)
        if name is None or pattern is None or not 0 <= index < len(statements):
            continue
        values = dupkey.key_value(pattern, document_of(statements[index]))
        error.update(dupkey.error_fields(namespace_of(ctx), name, pattern, values))

