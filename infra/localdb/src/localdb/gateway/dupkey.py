"""Duplicate-key errors as MongoDB reports them: E11000 message, keyPattern, keyValue.

The engine says which index was violated but not with which values, in one
of two shapes: a write error naming the index ("... Index 'k_1'"), or a
PostgreSQL error whose DETAIL holds the key pattern and the offending
document as BSONHEX literals. Drivers need `keyPattern` and `keyValue`
(pymongo's DuplicateKeyError.details), so they are rebuilt here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import bson

from localdb.gateway.errors import Code, MongoError
from localdb.gateway.wire import CODEC

_INDEX_IN_MESSAGE = re.compile(r"Index '([^']*)'")
_PATTERN_LITERAL = re.compile(r"'BSONHEX([0-9a-fA-F]+)'::documentdb_core\.bson")
_NEW_KEY = re.compile(r"\)=\((?:-?\d+, )?BSONHEX([0-9a-fA-F]+)")
_MISSING = object()


def index_from_message(errmsg: str) -> str | None:
    """The index name in the engine's write-error message, if any."""
    match = _INDEX_IN_MESSAGE.search(errmsg)
    return match.group(1) if match else None


def parse_detail(detail: str | None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(keyPattern, key document) from a unique/exclusion violation's DETAIL.

    Exclusion constraints (unique secondary indexes) show the key pattern as
    a literal and the new document first in the conflicting tuple; the _id
    primary key shows only the new _id, as {"": value}.
    """
    if not detail:
        return None
    new_key = _NEW_KEY.search(detail)
    if new_key is None:
        return None
    doc = _hex_document(new_key.group(1))
    pattern = _PATTERN_LITERAL.search(detail)
    if pattern is not None:
        return _hex_document(pattern.group(1)), doc
    if "object_id" in detail and "" in doc:
        return {"_id": 1}, {"_id": doc[""]}
    return None


def _hex_document(text: str) -> dict[str, Any]:
    """Decode a BSONHEX literal."""
    result: dict[str, Any] = bson.decode(bytes.fromhex(text), CODEC)
    return result


def key_value(pattern: Mapping[str, Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    """The values `doc` has for each field of the index key pattern (missing -> null)."""
    values = {}
    for path in pattern:
        found = lookup_path(doc, path)
        values[path] = None if found is _MISSING else found
    return values


def lookup_path(doc: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or a sentinel when absent."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def equality_fields(query: Mapping[str, Any]) -> dict[str, Any]:
    """Fields a query pins to one value: {f: v}, {f: {$eq: v}} and those inside $and."""
    fields: dict[str, Any] = {}
    for name, value in query.items():
        if name == "$and" and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    fields.update(equality_fields(clause))
        elif not name.startswith("$"):
            if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
                if set(value) == {"$eq"}:
                    fields[name] = value["$eq"]
            else:
                fields[name] = value
    return fields


def only_equalities(query: Mapping[str, Any]) -> bool:
    """True when every condition of `query` is an equality ({f: v}, {f: {$eq: v}}, in $and)."""
    for name, value in query.items():
        if name == "$and" and isinstance(value, list):
            if not all(isinstance(c, Mapping) and only_equalities(c) for c in value):
                return False
        elif str(name).startswith("$") or not _is_equality(value):
            return False
    return True


def _is_equality(value: Any) -> bool:
    """True for a plain value or ``{"$eq": v}``; False for any other operator document."""
    operators = isinstance(value, Mapping) and any(str(k).startswith("$") for k in value)
    return not operators or set(value) == {"$eq"}


def upsert_document(statement: Mapping[str, Any]) -> dict[str, Any]:
    """Best guess at what an update statement wrote: query equalities plus set fields."""
    doc = _expand(equality_fields(statement.get("q") or statement.get("query") or {}))
    update = statement.get("u", statement.get("update"))
    if isinstance(update, Mapping) and not any(str(k).startswith("$") for k in update):
        doc.update(update)  # a replacement document
    elif isinstance(update, Mapping):
        for operator in ("$setOnInsert", "$set"):
            doc.update(_expand(update.get(operator) or {}))
    return doc


def _expand(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}} so that `lookup_path` finds dotted fields."""
    doc: dict[str, Any] = {}
    for path, value in flat.items():
        parts = path.split(".")
        node = doc
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return doc


def default_index_name(pattern: Mapping[str, Any]) -> str:
    """The name MongoDB gives an index it was not asked to name: "a_1_b_-1"."""
    return "_".join(f"{k}_{v}" for k, v in pattern.items())


def error_fields(namespace: str, index: str, pattern: Mapping[str, Any],
                 values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields MongoDB puts in a duplicate-key error (command or write error)."""
    message = (f"E11000 duplicate key error collection: {namespace} index: {index} "
               f"dup key: {{ {', '.join(f'{k}: {_show(v)}' for k, v in values.items())} }}")
    return {"errmsg": message, "keyPattern": dict(pattern), "keyValue": dict(values)}


def _show(value: Any) -> str:
    """A value as the server's messages print it."""
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def duplicate_key_error(namespace: str, index: str, pattern: Mapping[str, Any],
                        values: Mapping[str, Any]) -> MongoError:
    """A command-level DuplicateKey error carrying keyPattern and keyValue."""
    fields = error_fields(namespace, index, pattern, values)
    return MongoError(Code.DuplicateKey, fields.pop("errmsg"), **fields)
