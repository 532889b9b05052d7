"""Collections, indexes and databases: create, drop, list, modify, stats."""

from __future__ import annotations

from typing import Any

from localdb.gateway import wire
from localdb.gateway.context import Context, Handler, Reply
from localdb.gateway.errors import Code, MongoError
from localdb.gateway.pg import Statement


def _select(name: str, call: str) -> Statement:
    """A one-value `SELECT <call>` statement."""
    return Statement(f"gw_{name}".encode(), f"SELECT {call}".encode())


BSON = "documentdb_core.bson"
# In-line index builds: no waiting for the engine's background builder (a
# pg_cron job every 2 s); fine for a local server, where blocking writes to
# the collection during the build costs nothing. The last argument skips the
# engine's "new indexes only on collections created in this transaction"
# check, which otherwise refuses every existing collection even in autocommit.
CREATE_INDEXES = _select("create_indexes", "documentdb_api_internal."
                         f"create_indexes_non_concurrently($1::text, $2::{BSON}, true)")
DROP_INDEXES = _select("drop_indexes", "documentdb_api_internal."
                       f"drop_indexes_non_concurrently($1::text, $2::{BSON})")
CREATE = _select("create", f"documentdb_api.create_collection_view($1::text, $2::{BSON})")
DROP = _select("drop", "documentdb_api.drop_collection($1::text, $2::text)")
DROP_DATABASE = _select("drop_database", "documentdb_api.drop_database($1::text)")
COLL_MOD = _select("coll_mod", f"documentdb_api.coll_mod($1::text, $2::text, $3::{BSON})")
RENAME = _select("rename", f"documentdb_api.rename_collection($1::{BSON})")
LIST_DATABASES = _select("list_databases", f"documentdb_api.list_databases($1::{BSON})")
DB_STATS = _select("db_stats", "documentdb_api.db_stats($1::text, $2::text::float8, false)")
COLL_STATS = _select("coll_stats",
                     "documentdb_api.coll_stats($1::text, $2::text, $3::text::float8)")
VALIDATE = Statement(b"gw_validate", b"SELECT document FROM documentdb_api.validate("
                     b"$1::text, $2::documentdb_core.bson)")


def create_indexes(ctx: Context) -> Reply:
    """createIndexes; the engine's per-shard reply is flattened to MongoDB's shape."""
    result = _decoded(ctx.run_raw(CREATE_INDEXES)[0])
    shard = result.get("raw", {}).get("defaultShard", result)
    if not shard.get("ok", result.get("ok")):
        raise MongoError(shard.get("code", Code.CannotCreateIndex),
                         shard.get("errmsg", "createIndexes failed"))
    return {**{k: v for k, v in shard.items() if k != "ok"}, "ok": 1.0}


def drop_indexes(ctx: Context) -> Reply:
    """dropIndexes (and its old name deleteIndexes)."""
    spec = ctx.request.raw_body
    if ctx.request.name != "dropIndexes":
        renamed = {"dropIndexes": ctx.body[ctx.request.name]}
        spec = wire.encode({**renamed, **{k: v for k, v in ctx.body.items()
                                          if k != ctx.request.name}})
    return _ok(_decoded(ctx.run(DROP_INDEXES, ctx.db_param, spec)[0]))


def create(ctx: Context) -> Reply:
    """create (collections and views)."""
    return _ok(_decoded(ctx.run_raw(CREATE)[0]))


def drop(ctx: Context) -> Reply:
    """drop; a missing collection is not an error (MongoDB 7.0 behaviour)."""
    name = _collection(ctx)
    ctx.run(DROP, ctx.db_param, name.encode())
    return {"ns": f"{ctx.db}.{name}", "ok": 1.0}


def drop_database(ctx: Context) -> Reply:
    """dropDatabase."""
    ctx.run(DROP_DATABASE, ctx.db_param)
    return {"dropped": ctx.db, "ok": 1.0}


def coll_mod(ctx: Context) -> Reply:
    """collMod."""
    row = ctx.run(COLL_MOD, ctx.db_param, _collection(ctx).encode(), ctx.request.raw_body)
    return _ok(_decoded(row[0]))


def rename_collection(ctx: Context) -> Reply:
    """renameCollection (an admin command naming both namespaces)."""
    return _ok(_decoded(ctx.run(RENAME, ctx.request.raw_body)[0]))


def list_databases(ctx: Context) -> Reply:
    """listDatabases."""
    spec = {k: v for k, v in ctx.body.items() if k in ("listDatabases", "nameOnly", "filter")}
    result = _ok(_decoded(ctx.run(LIST_DATABASES, wire.encode(spec))[0]))
    if ctx.body.get("nameOnly"):
        result["databases"] = [{"name": d["name"]} for d in result.get("databases", [])]
    return result


def db_stats(ctx: Context) -> Reply:
    """dbStats."""
    return _ok(_decoded(ctx.run(DB_STATS, ctx.db_param, _scale(ctx))[0]))


def coll_stats(ctx: Context) -> Reply:
    """collStats."""
    row = ctx.run(COLL_STATS, ctx.db_param, _collection(ctx).encode(), _scale(ctx))
    return _ok(_decoded(row[0]))


def validate(ctx: Context) -> Reply:
    """validate."""
    return ctx.run_raw(VALIDATE)[0] or b""


def _collection(ctx: Context) -> str:
    """The collection named by the command, required to be a string."""
    name = ctx.body.get(ctx.request.name)
    if not isinstance(name, str) or not name:
        raise MongoError(Code.InvalidNamespace, f"{ctx.request.name} needs a collection name")
    return name


def _scale(ctx: Context) -> bytes:
    """The `scale` option as a text parameter."""
    scale = ctx.body.get("scale", 1)
    if not isinstance(scale, int | float) or scale <= 0:
        raise MongoError(Code.BadValue, "scale must be a positive number")
    return str(scale).encode()


def _decoded(value: bytes | None) -> dict[str, Any]:
    """A BSON column, decoded (an absent value is an empty document)."""
    return wire.decode(value) if value else {}


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    """Make `ok` a double (the engine returns booleans and ints in places)."""
    result["ok"] = float(result.get("ok", 1))
    return result


HANDLERS: dict[str, Handler] = {
    "createIndexes": create_indexes,
    "dropIndexes": drop_indexes,
    "deleteIndexes": drop_indexes,
    "create": create,
    "drop": drop,
    "dropDatabase": drop_database,
    "collMod": coll_mod,
    "renameCollection": rename_collection,
    "listDatabases": list_databases,
    "dbStats": db_stats,
    "collStats": coll_stats,
    "validate": validate,
}
