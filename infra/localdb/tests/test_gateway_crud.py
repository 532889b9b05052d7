"""CRUD, indexes, queries and bulk writes through pymongo -> gateway -> DocumentDB."""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo import (
    ASCENDING,
    DESCENDING,
    DeleteOne,
    InsertOne,
    ReplaceOne,
    ReturnDocument,
    UpdateOne,
)
from pymongo.database import Database
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure


def test_unique_index_duplicate_key_details(gw_db: Database) -> None:
    events = gw_db.events
    assert events.create_index("event_id", unique=True) == "event_id_1"
    events.insert_one({"event_id": "e1"})
    with pytest.raises(DuplicateKeyError) as caught:
        events.insert_one({"event_id": "e1", "other": 2})
    details = caught.value.details or {}
    assert caught.value.code == 11000
    assert details["keyPattern"] == {"event_id": 1}
    assert details["keyValue"] == {"event_id": "e1"}
    assert "E11000 duplicate key error" in details["errmsg"]
    assert "index: event_id_1" in details["errmsg"]


def test_duplicate_id_details(gw_db: Database) -> None:
    gw_db.c.insert_one({"_id": "x"})
    with pytest.raises(DuplicateKeyError) as caught:
        gw_db.c.insert_one({"_id": "x"})
    assert caught.value.details["keyPattern"] == {"_id": 1}
    assert caught.value.details["keyValue"] == {"_id": "x"}


def test_find_one_and_update_duplicate_is_command_error(gw_db: Database) -> None:
    gw_db.c.create_index([("k", ASCENDING), ("j", ASCENDING)], unique=True)
    gw_db.c.insert_one({"k": 1, "j": 2})
    with pytest.raises(DuplicateKeyError) as caught:
        gw_db.c.find_one_and_update({"k": 9}, {"$set": {"k": 1, "j": 2}}, upsert=True)
    assert caught.value.details["keyPattern"] == {"k": 1, "j": 1}
    assert caught.value.details["keyValue"] == {"k": 1, "j": 2}
    assert caught.value.details["codeName"] == "DuplicateKey"


def test_find_one_and_update_upsert_and_return_document(gw_db: Database) -> None:
    jobs = gw_db.jobs
    before = jobs.find_one_and_update(
        {"_id": "job-1"}, {"$setOnInsert": {"state": "new"}, "$inc": {"n": 1}},
        upsert=True, return_document=ReturnDocument.BEFORE)
    assert before is None
    after = jobs.find_one_and_update(
        {"_id": "job-1"}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER)
    assert after == {"_id": "job-1", "state": "new", "n": 2}
    created = jobs.find_one_and_update(
        {"_id": "job-2"}, {"$set": {"state": "x"}}, upsert=True,
        return_document=ReturnDocument.AFTER)
    assert created == {"_id": "job-2", "state": "x"}
    assert jobs.find_one_and_update({"_id": "nope"}, {"$set": {"a": 1}}) is None


# The framework's claim: new / PENDING / retryable FAILED / expired PROCESSING
# records are taken; anything else is left unchanged. The BEFORE image says which.
CLAIM = [{"$set": {
    "taken": {"$or": [
        {"$eq": [{"$type": "$status"}, "missing"]},
        {"$eq": ["$status", "PENDING"]},
        {"$and": [{"$eq": ["$status", "FAILED"]}, {"$eq": ["$retryable", True]}]},
        {"$and": [{"$eq": ["$status", "PROCESSING"]}, {"$lt": ["$lease_until", "$$NOW"]}]},
    ]},
}}, {"$set": {
    "status": {"$cond": ["$taken", "PROCESSING", "$status"]},
    "attempts": {"$cond": ["$taken", {"$add": [{"$ifNull": ["$attempts", 0]}, 1]},
                           "$attempts"]},
    "lease_until": {"$cond": ["$taken", {"$add": ["$$NOW", 60_000]}, "$lease_until"]},
}}, {"$unset": "taken"}]


def test_pipeline_update_find_and_modify_upsert_before(gw_db: Database) -> None:
    events = gw_db.events
    events.create_index("key", unique=True)
    before = events.find_one_and_update({"key": "k1"}, CLAIM, upsert=True,
                                        return_document=ReturnDocument.BEFORE)
    assert before is None  # new: inserted and claimed
    stored = events.find_one({"key": "k1"}, {"_id": 0, "lease_until": 0})
    assert stored == {"key": "k1", "status": "PROCESSING", "attempts": 1}
    again = events.find_one_and_update({"key": "k1"}, CLAIM, upsert=True,
                                       return_document=ReturnDocument.BEFORE)
    assert again["status"] == "PROCESSING" and again["attempts"] == 1
    assert events.find_one({"key": "k1"})["attempts"] == 1  # live lease: unchanged
    events.update_one({"key": "k1"}, {"$set": {"status": "FAILED", "retryable": True}})
    retried = events.find_one_and_update({"key": "k1"}, CLAIM, upsert=True,
                                         return_document=ReturnDocument.BEFORE)
    assert retried["status"] == "FAILED"
    assert events.find_one({"key": "k1"})["attempts"] == 2


def test_set_on_insert_inc_push(gw_db: Database) -> None:
    counters = gw_db.counters
    for item in ("a", "b"):
        counters.update_one({"partner": "acme", "day": "2024-01-01"},
                            {"$setOnInsert": {"created": "first"}, "$inc": {"count": 1},
                             "$push": {"ids": item}}, upsert=True)
    doc = counters.find_one({"partner": "acme"}, {"_id": 0})
    assert doc == {"partner": "acme", "day": "2024-01-01", "created": "first", "count": 2,
                   "ids": ["a", "b"]}


def test_compound_index_listed_and_dropped(gw_db: Database) -> None:
    coll = gw_db.events
    coll.insert_many([{"partner": f"p{i % 3}", "received_at": i} for i in range(30)])
    name = coll.create_index([("partner", ASCENDING), ("received_at", DESCENDING)])
    assert name == "partner_1_received_at_-1"
    info = coll.index_information()
    assert info[name]["key"] == [("partner", 1), ("received_at", -1)]
    coll.drop_index(name)
    assert name not in coll.index_information()
    with pytest.raises(OperationFailure) as caught:
        coll.drop_index("no_such_index")
    assert caught.value.code == 27  # IndexNotFound


def test_sort_skip_limit_projection(gw_db: Database) -> None:
    coll = gw_db.items
    coll.insert_many([{"n": i, "p": f"p{i % 3}", "big": "x" * 10} for i in range(20)])
    top = [d["n"] for d in coll.find({}, {"n": 1}).sort("n", DESCENDING).limit(3)]
    assert top == [19, 18, 17]
    page = list(coll.find({"p": "p0"}, {"_id": 0, "n": 1, "p": 1})
                .sort("n", DESCENDING).skip(1).limit(2))
    assert page == [{"n": 15, "p": "p0"}, {"n": 12, "p": "p0"}]


def test_cursor_get_more_and_kill(gw_db: Database) -> None:
    coll = gw_db.many
    coll.insert_many([{"n": i} for i in range(250)])
    assert len(list(coll.find({}, batch_size=7))) == 250  # continuation cursor
    ordered = [d["n"] for d in coll.find({}).sort("n", ASCENDING).batch_size(9)]
    assert ordered == list(range(250))  # sorted: the engine persists this cursor
    cursor = coll.find({}).sort("n", DESCENDING).batch_size(5)
    assert next(cursor)["n"] == 249
    cursor.close()  # killCursors
    assert coll.count_documents({}) == 250


def test_count_and_distinct(gw_db: Database) -> None:
    coll = gw_db.items
    coll.insert_many([{"p": f"p{i % 3}", "n": Int64(i)} for i in range(20)])
    assert coll.count_documents({"p": "p1"}) == 7
    assert coll.count_documents({}, limit=5) == 5
    assert coll.estimated_document_count() >= 0
    assert sorted(coll.distinct("p")) == ["p0", "p1", "p2"]
    assert isinstance(coll.find_one({"n": 3})["n"], Int64)  # types survive the trip


def test_aggregate_group_and_lookup(gw_db: Database) -> None:
    gw_db.orders.insert_many([{"partner": f"p{i % 2}", "amount": i} for i in range(10)])
    gw_db.partners.insert_many([{"_id": "p0", "name": "Acme"}, {"_id": "p1", "name": "Bolt"}])
    grouped = list(gw_db.orders.aggregate([
        {"$group": {"_id": "$partner", "total": {"$sum": "$amount"}, "n": {"$sum": 1}}},
        {"$sort": {"_id": 1}}]))
    assert grouped == [{"_id": "p0", "total": 20, "n": 5}, {"_id": "p1", "total": 25, "n": 5}]
    joined = list(gw_db.orders.aggregate([
        {"$match": {"amount": {"$lt": 2}}}, {"$sort": {"amount": 1}},
        {"$lookup": {"from": "partners", "localField": "partner", "foreignField": "_id",
                     "as": "who"}},
        {"$project": {"_id": 0, "amount": 1, "name": {"$first": "$who.name"}}}]))
    assert joined == [{"amount": 0, "name": "Acme"}, {"amount": 1, "name": "Bolt"}]


def test_bulk_write_ordered_stops_at_duplicate(gw_db: Database) -> None:
    coll = gw_db.bulk
    coll.create_index("k", unique=True)
    coll.insert_one({"k": 1})
    with pytest.raises(BulkWriteError) as caught:
        coll.bulk_write([InsertOne({"k": 2}), InsertOne({"k": 1}), InsertOne({"k": 3})])
    details = caught.value.details
    assert details["nInserted"] == 1
    [error] = details["writeErrors"]
    assert (error["index"], error["code"]) == (1, 11000)
    assert error["keyPattern"] == {"k": 1} and error["keyValue"] == {"k": 1}
    assert coll.count_documents({}) == 2


def test_bulk_write_unordered_continues(gw_db: Database) -> None:
    coll = gw_db.bulk
    coll.create_index("k", unique=True)
    coll.insert_one({"k": 1})
    with pytest.raises(BulkWriteError) as caught:
        coll.insert_many([{"k": 1}, {"k": 2}, {"k": 2}, {"k": 3}], ordered=False)
    details = caught.value.details
    assert details["nInserted"] == 2
    assert [(e["index"], e["keyValue"]) for e in details["writeErrors"]] == [
        (0, {"k": 1}), (2, {"k": 2})]


def test_bulk_write_mixed_operations(gw_db: Database) -> None:
    coll = gw_db.bulk
    coll.insert_many([{"_id": i, "v": 0} for i in range(3)])
    result = coll.bulk_write([
        InsertOne({"_id": 10}), UpdateOne({"_id": 0}, {"$set": {"v": 1}}),
        UpdateOne({"_id": 20}, {"$set": {"v": 2}}, upsert=True),
        ReplaceOne({"_id": 1}, {"v": 9}), DeleteOne({"_id": 2})])
    assert (result.inserted_count, result.matched_count, result.modified_count,
            result.upserted_count, result.deleted_count) == (1, 2, 2, 1, 1)
    assert result.upserted_ids == {2: 20}


def test_update_duplicate_write_error_details(gw_db: Database) -> None:
    coll = gw_db.c
    coll.create_index("k", unique=True)
    coll.insert_many([{"_id": 1, "k": "a"}, {"_id": 2, "k": "b"}])
    with pytest.raises(DuplicateKeyError) as caught:
        coll.update_one({"_id": 2}, {"$set": {"k": "a"}})
    assert caught.value.details["keyValue"] == {"k": "a"}


def test_collections_and_databases(gw_db: Database, gw_client) -> None:
    gw_db.create_collection("made")
    gw_db.other.insert_one({"x": 1})
    assert {"made", "other"} <= set(gw_db.list_collection_names())
    assert gw_db.name in gw_client.list_database_names()
    gw_db.other.rename("renamed")
    assert "renamed" in gw_db.list_collection_names()
    gw_db.drop_collection("renamed")
    gw_db.drop_collection("never_existed")  # not an error
    assert "renamed" not in gw_db.list_collection_names()
    assert gw_db.command("dbStats")["ok"] == 1.0
    assert gw_db.command("collStats", "made")["ok"] == 1.0


def test_unknown_command_and_engine_errors(gw_db: Database) -> None:
    with pytest.raises(OperationFailure) as caught:
        gw_db.command("noSuchCommand")
    assert caught.value.code == 59
    with pytest.raises(OperationFailure) as caught:
        gw_db.c.update_one({"_id": 1}, {"$bogus": {"a": 1}})
    assert caught.value.code == 9  # FailedToParse, mapped from the engine's SQLSTATE
    with pytest.raises(OperationFailure) as caught:
        gw_db.c.find_one({"$bogus": 1})
    assert caught.value.code == 2


def test_handshake_and_admin_commands(gw_client) -> None:
    hello = gw_client.admin.command("hello")
    assert hello["isWritablePrimary"] and hello["maxWireVersion"] >= 17
    assert gw_client.admin.command("isMaster")["ismaster"] is True
    assert gw_client.server_info()["version"].startswith("7.")
    for name in ("ping", "serverStatus", "hostInfo", "whatsmyuri", "connectionStatus"):
        assert gw_client.admin.command(name)["ok"] == 1.0


def test_large_insert_many_is_split_by_the_driver(gw_db: Database) -> None:
    # The engine takes at most 25,000 writes per command; hello says so.
    result = gw_db.big.insert_many([{"i": i} for i in range(30_000)])
    assert len(result.inserted_ids) == 30_000
    assert gw_db.big.count_documents({}) == 30_000
    assert sum(1 for _ in gw_db.big.find({}, {"_id": 1}, batch_size=5000)) == 30_000


def test_many_open_sorted_cursors(gw_db: Database) -> None:
    # Sorted cursors keep a PostgreSQL session each; past the gateway's limit
    # they are buffered in memory. Either way every one of them must complete.
    coll = gw_db.many
    coll.insert_many([{"n": i} for i in range(60)])
    cursors = [coll.find({}).sort("n", DESCENDING).batch_size(7) for _ in range(40)]
    firsts = [next(cursor)["n"] for cursor in cursors]
    assert firsts == [59] * 40
    for cursor in cursors:
        assert [d["n"] for d in cursor] == list(range(58, -1, -1))
    assert coll.count_documents({}) == 60  # and commands still get sessions


def test_explain_shows_the_postgresql_plan(gw_db: Database) -> None:
    gw_db.c.create_index("k")
    gw_db.c.insert_many([{"k": i} for i in range(50)])
    plan = gw_db.c.find({"k": 7}).explain()
    assert plan["queryPlanner"]["namespace"] == f"{gw_db.name}.c"
    assert "Node Type" in plan["queryPlanner"]["winningPlan"]["plan"]
    assert gw_db.command("explain", {"count": "c", "query": {"k": 1}})["ok"] == 1.0


def test_an_insert_only_upsert_stops_an_ordered_update_on_the_duplicate_key(
        gw_db: Database) -> None:
    # An upsert whose query has more than equalities on the unique key's fields
    # is not retried (MongoDB's rule): its duplicate key comes back at once and
    # an ordered command stops there, before the statements after it.
    events = gw_db.events
    events.create_index("k", unique=True)
    events.insert_one({"k": "a", "owner": "first"})
    writes = [UpdateOne({"k": "a", "owner": "second"}, {"$setOnInsert": {"n": 1}}, upsert=True),
              UpdateOne({"k": "b"}, {"$set": {"n": 2}}, upsert=True)]
    with pytest.raises(BulkWriteError) as caught:
        events.bulk_write(writes, ordered=True)
    errors = caught.value.details["writeErrors"]
    assert [(e["index"], e["code"]) for e in errors] == [(0, 11000)]
    assert events.find_one({"k": "b"}) is None
    assert events.find_one({"k": "a"}, {"_id": 0}) == {"k": "a", "owner": "first"}
    result = events.bulk_write([UpdateOne({"k": "c", "owner": "o"}, {"$setOnInsert": {"n": 1}},
                                          upsert=True), writes[1]], ordered=True)
    assert (result.upserted_count, events.find_one({"k": "c"}, {"_id": 0})) == \
        (2, {"k": "c", "owner": "o", "n": 1})
