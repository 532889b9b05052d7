"""Error mapping and duplicate-key details, without a server."""

from __future__ import annotations

import bson
import pytest

from localdb.gateway import dupkey, errors, writes
from localdb.gateway.config import parse_listen
from localdb.gateway.errors import Code, MongoError


def pack_sqlstate(state: str) -> int:
    """PostgreSQL's MAKE_SQLSTATE."""
    return sum(((ord(c) - ord("0")) & 0x3F) << (6 * i) for i, c in enumerate(state))


@pytest.mark.parametrize("state, code", [
    ("M001C", 11000), ("M000M", 66), ("M0003", 9), ("M00F1", 112), ("M000E", 43),
    ("23505", 11000), ("40P01", 112), ("55P03", 112), ("08006", 6),
    ("MZZZZ", 2),  # an engine state without a name: a rejected request
    ("XX000", 1),
])
def test_sqlstate_mapping(state: str, code: int) -> None:
    assert errors.sqlstate_from_int(pack_sqlstate(state)) == state
    assert errors.code_for_sqlstate(state) == code


def test_write_error_codes_unpack() -> None:
    assert errors.code_for_engine_int(319029277) == 11000  # seen from the engine
    assert errors.code_for_engine_int(11000) == 11000  # already a MongoDB code
    assert errors.code_for_engine_int(pack_sqlstate("M000M")) == 66


def test_mongo_error_document() -> None:
    error = MongoError(Code.NoSuchTransaction, "gone", labels=("TransientTransactionError",),
                       extra_field=1)
    assert error.to_document() == {
        "ok": 0.0, "errmsg": "gone", "code": 251, "codeName": "NoSuchTransaction",
        "extra_field": 1, "errorLabels": ["TransientTransactionError"]}
    assert errors.code_name(40324) == "UnrecognizedCommand"
    assert errors.code_name(123456) == "Location123456"


EXCLUSION_DETAIL = (
    "Key (document, documentdb_api_internal.generate_unique_shard_document(document, "
    "shard_key_value, 'BSONHEX{pattern}'::documentdb_core.bson, false, true))=(BSONHEX{doc}, "
    "BSONHEX{terms}) conflicts with existing key (document, x)=(BSONHEX00, BSONHEX00).")


def test_parse_exclusion_violation_detail() -> None:
    pattern = {"k": 1, "j": -1}
    doc = {"_id": 5, "k": "a", "j": {"x": 1}}
    detail = EXCLUSION_DETAIL.format(pattern=bson.encode(pattern).hex(),
                                     doc=bson.encode(doc).hex(),
                                     terms=bson.encode({"$numTerms": 2}).hex())
    parsed_pattern, parsed_doc = dupkey.parse_detail(detail)
    assert parsed_pattern == pattern and parsed_doc == doc
    assert dupkey.key_value(parsed_pattern, parsed_doc) == {"k": "a", "j": {"x": 1}}


def test_parse_primary_key_violation_detail() -> None:
    detail = (f"Key (shard_key_value, object_id)=(7, BSONHEX{bson.encode({'': 'x'}).hex()}) "
              "already exists.")
    assert dupkey.parse_detail(detail) == ({"_id": 1}, {"_id": "x"})
    assert dupkey.parse_detail("something else") is None
    assert dupkey.parse_detail(None) is None


def test_key_values_and_messages() -> None:
    doc = {"a": {"b": 2}, "c": None}
    assert dupkey.key_value({"a.b": 1, "c": 1, "d": 1}, doc) == {"a.b": 2, "c": None, "d": None}
    fields = dupkey.error_fields("db.coll", "a.b_1", {"a.b": 1}, {"a.b": "x"})
    assert fields["errmsg"] == ('E11000 duplicate key error collection: db.coll index: a.b_1 '
                                'dup key: { a.b: "x" }')
    assert dupkey.default_index_name({"a": 1, "b": -1}) == "a_1_b_-1"
    assert dupkey.index_from_message("Duplicate key violation ... Index 'k_1'") == "k_1"


def test_equality_fields_and_upsert_document() -> None:
    query = {"a": 1, "b": {"$eq": 2}, "c": {"$gt": 1}, "$and": [{"d": 4}], "e": {"x": 1}}
    assert dupkey.equality_fields(query) == {"a": 1, "b": 2, "d": 4, "e": {"x": 1}}
    statement = {"q": {"k": 1}, "u": {"$set": {"a.b": 2}, "$inc": {"n": 1}}}
    assert dupkey.upsert_document(statement) == {"k": 1, "a": {"b": 2}}
    assert dupkey.upsert_document({"q": {"k": 1}, "u": {"k": 1, "v": 2}}) == {"k": 1, "v": 2}


def test_upsert_retry_needs_equality_on_the_whole_key() -> None:
    assert writes._pins({"k": 1, "j": 2}, {"k": 1, "j": 1})
    assert not writes._pins({"k": 1}, {"k": 1, "j": 1})
    assert not writes._pins({"k": {"$gt": 1}}, {"k": 1})
    assert not writes._pins({"k": 1}, None)


def test_upsert_retry_needs_equalities_on_the_key_alone() -> None:
    # MongoDB retries only a query of equalities on exactly the index's fields:
    # an upsert meant to insert unless the document is in some state is not.
    assert writes._pins({"k": 1}, {"k": 1})
    assert writes._pins({"$and": [{"k": {"$eq": 1}}]}, {"k": 1})
    assert not writes._pins({"k": 1, "owner": "o"}, {"k": 1})
    assert not writes._pins({"k": 1, "holder": {"$exists": False}}, {"k": 1})
    assert not writes._pins({"k": 1, "$or": [{"p": 1}, {"p": 2}]}, {"k": 1})


def test_merge_of_a_retried_tail() -> None:
    first = {"n": 1, "nModified": 1, "ok": 1.0,
             "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}]}
    retry = {"n": 2, "nModified": 1, "ok": 1.0, "upserted": [{"index": 1, "_id": "x"}]}
    merged = writes._merge(first, first["writeErrors"][0], retry, offset=1)
    assert merged == {"n": 3, "nModified": 2, "ok": 1.0, "upserted": [{"index": 2, "_id": "x"}]}


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:27018", ("127.0.0.1", 27018)), ("[::1]:0", ("::1", 0)),
    (":27020", ("127.0.0.1", 27020)),
])
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["27018", "host:", "host:99999", "host:x"])
def test_parse_listen_refuses(value: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(value)
