"""Sessions and transactions, mapped to PostgreSQL transactions."""

from __future__ import annotations

import threading

import pytest
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, OperationFailure


def test_commit_makes_writes_visible_only_then(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    coll.insert_one({"_id": "seed"})
    with gw_client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "a"}, session=session)
        coll.update_one({"_id": "seed"}, {"$set": {"touched": True}}, session=session)
        assert coll.find_one({"_id": "a"}, session=session) is not None  # read your writes
        assert coll.find_one({"_id": "a"}) is None  # invisible outside
        session.commit_transaction()
    assert coll.find_one({"_id": "a"}) is not None
    assert coll.find_one({"_id": "seed"})["touched"] is True


def test_abort_discards_writes(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    with gw_client.start_session() as session:
        session.start_transaction()
        coll.insert_many([{"_id": i} for i in range(5)], session=session)
        session.abort_transaction()
    assert coll.count_documents({}) == 0


def test_with_transaction_commits_callback(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    coll.insert_one({"_id": "acct", "balance": 10})

    def move(session: ClientSession) -> str:
        coll.update_one({"_id": "acct"}, {"$inc": {"balance": -3}}, session=session)
        coll.insert_one({"_id": "log-1", "amount": 3}, session=session)
        return "done"

    with gw_client.start_session() as session:
        assert session.with_transaction(move) == "done"
    assert coll.find_one({"_id": "acct"})["balance"] == 7
    assert coll.count_documents({"_id": "log-1"}) == 1


def test_error_aborts_transaction(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    coll.insert_one({"_id": "dup"})
    with gw_client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "kept?"}, session=session)
        with pytest.raises(DuplicateKeyError):
            coll.insert_one({"_id": "dup"}, session=session)
        with pytest.raises(OperationFailure) as caught:
            session.commit_transaction()
        assert caught.value.code == 251  # NoSuchTransaction: it was aborted
    assert coll.find_one({"_id": "kept?"}) is None


def test_cursor_inside_transaction(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    with gw_client.start_session() as session:
        session.start_transaction()
        coll.insert_many([{"n": i} for i in range(30)], session=session)
        found = [d["n"] for d in coll.find({}, session=session).sort("n", 1).batch_size(4)]
        assert found == list(range(30))
        session.commit_transaction()


def test_write_conflict_is_transient(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.txn
    coll.insert_one({"_id": "row", "v": 0})
    with gw_client.start_session() as first, gw_client.start_session() as second:
        first.start_transaction()
        second.start_transaction()
        coll.update_one({"_id": "row"}, {"$set": {"v": 1}}, session=first)
        with pytest.raises(OperationFailure) as caught:
            coll.update_one({"_id": "row"}, {"$set": {"v": 2}}, session=second)
        assert caught.value.code == 112  # WriteConflict
        assert caught.value.has_error_label("TransientTransactionError")
        first.commit_transaction()
    assert coll.find_one({"_id": "row"})["v"] == 1


def test_with_transaction_retries_a_write_conflict(gw_db: Database,
                                                   gw_client: MongoClient) -> None:
    coll = gw_db.txn
    coll.insert_one({"_id": "row", "v": 0})
    attempts = []
    with gw_client.start_session() as holder, gw_client.start_session() as session:
        holder.start_transaction()
        coll.update_one({"_id": "row"}, {"$inc": {"v": 1}}, session=holder)
        timer = threading.Timer(0.3, holder.commit_transaction)
        timer.start()

        def bump(s: ClientSession) -> None:
            attempts.append(1)
            coll.update_one({"_id": "row"}, {"$inc": {"v": 10}}, session=s)

        session.with_transaction(bump)
        timer.join()
    assert len(attempts) > 1  # the first attempt met the holder's lock
    assert coll.find_one({"_id": "row"})["v"] == 11
