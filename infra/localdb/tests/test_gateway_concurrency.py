"""Many clients at once: lease races, concurrent upserts, parallel connections."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path

from pymongo import MongoClient, ReturnDocument
from pymongo.database import Database

from localdb_support import GatewayProcess, start_gateway


def run_together(count: int, work: Callable[[int], object]) -> list[object]:
    """Run `work(i)` on `count` threads released at the same instant; results or errors."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_sixteen_threads_one_lease_one_winner(gw_db: Database, gateway: GatewayProcess) -> None:
    client = gateway.client(maxPoolSize=32)
    leases = client[gw_db.name].leases
    now = dt.datetime.now(dt.UTC)
    leases.insert_one({"_id": "job", "owner": None, "lease_until": now - dt.timedelta(hours=1)})

    def claim(i: int) -> object:
        return leases.find_one_and_update(
            {"_id": "job", "$or": [{"owner": None}, {"lease_until": {"$lt": now}}]},
            {"$set": {"owner": f"w{i}", "lease_until": now + dt.timedelta(minutes=5)}},
            return_document=ReturnDocument.AFTER)

    try:
        results = run_together(16, claim)
    finally:
        client.close()
    assert not [r for r in results if isinstance(r, Exception)]
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert gw_db.leases.find_one({"_id": "job"})["owner"] == winners[0]["owner"]


def test_hundred_concurrent_upserts_one_document(gw_db: Database,
                                                 gateway: GatewayProcess) -> None:
    gw_db.events.create_index("key", unique=True)
    client = gateway.client(maxPoolSize=100)
    events = client[gw_db.name].events

    def upsert(i: int) -> object:
        return events.update_one({"key": "same"},
                                 {"$setOnInsert": {"first": i}, "$inc": {"seen": 1}},
                                 upsert=True)

    try:
        results = run_together(100, upsert)
    finally:
        client.close()
    assert [r for r in results if isinstance(r, Exception)] == []
    assert gw_db.events.count_documents({}) == 1
    assert gw_db.events.find_one({"key": "same"})["seen"] == 100


def test_concurrent_claims_with_pipeline_upsert(gw_db: Database,
                                                gateway: GatewayProcess) -> None:
    gw_db.events.create_index("key", unique=True)
    client = gateway.client(maxPoolSize=32)
    events = client[gw_db.name].events
    def take(i: int) -> object:
        pipeline = [{"$set": {"owner": {"$ifNull": ["$owner", f"w{i}"]}}}]
        return events.find_one_and_update({"key": "k"}, pipeline, upsert=True,
                                          return_document=ReturnDocument.BEFORE)

    try:
        results = run_together(24, take)
    finally:
        client.close()
    assert [r for r in results if isinstance(r, Exception)] == []
    assert sum(1 for r in results if r is None) == 1  # exactly one saw "new"
    assert gw_db.events.count_documents({}) == 1


def test_many_clients_in_parallel(gw_db: Database, gateway: GatewayProcess) -> None:
    clients = [gateway.client() for _ in range(20)]

    def work(i: int) -> object:
        coll = clients[i][gw_db.name].par
        coll.insert_many([{"c": i, "n": n} for n in range(50)])
        return coll.count_documents({"c": i})

    try:
        results = run_together(20, work)
    finally:
        for client in clients:
            client.close()
    assert results == [50] * 20


def test_pool_is_bounded(gw_client: MongoClient, gateway: GatewayProcess) -> None:
    # Each pymongo connection is a thread in the gateway, not a PostgreSQL session.
    client = gateway.client(maxPoolSize=60)
    try:
        results = run_together(60, lambda i: client.admin.command("ping")["ok"])
    finally:
        client.close()
    assert results == [1.0] * 60
    assert gw_client.admin.command("ping")["ok"] == 1.0


def test_upsert_race_across_two_gateways(gw_db: Database, gateway: GatewayProcess,
                                         pg_dsn: str, tmp_path: Path) -> None:
    # Two processes cannot serialise each other's upserts: this exercises the
    # duplicate-key and deadlock retries themselves (several rounds, as one
    # round does not always collide).
    gw_db.events.create_index("key", unique=True)
    second = start_gateway(pg_dsn, tmp_path / "second.log")
    clients = [gateway.client(maxPoolSize=8), second.client(maxPoolSize=8)]
    rounds, per_key = 12, 8

    def upsert(i: int) -> object:
        events = clients[i % 2][gw_db.name].events
        return events.find_one_and_update({"key": f"k{i // per_key}"}, {"$inc": {"seen": 1}},
                                          upsert=True)

    try:
        results = run_together(rounds * per_key, upsert)
    finally:
        for client in clients:
            client.close()
        assert second.stop() == 0, second.log()
    assert [r for r in results if isinstance(r, Exception)] == []
    assert sorted(d["seen"] for d in gw_db.events.find()) == [per_key] * rounds
