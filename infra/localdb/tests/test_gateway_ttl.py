"""TTL indexes, with expiry triggered on demand instead of waiting for pg_cron's minute."""

from __future__ import annotations

import datetime as dt

from pymongo import MongoClient
from pymongo.database import Database

from localdb.gateway import EXPIRE_TTL_COMMAND


def test_ttl_index_and_deterministic_expiry(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.ttl
    name = coll.create_index("expire_at", expireAfterSeconds=0)
    assert coll.index_information()[name]["expireAfterSeconds"] == 0
    now = dt.datetime.now(dt.UTC)
    coll.insert_many([
        {"_id": "old", "expire_at": now - dt.timedelta(seconds=5)},
        {"_id": "future", "expire_at": now + dt.timedelta(hours=1)},
        {"_id": "no-date", "expire_at": "not a date"},
        {"_id": "no-field"},
    ])
    assert gw_client.admin.command(EXPIRE_TTL_COMMAND)["ok"] == 1.0
    remaining = sorted(d["_id"] for d in coll.find({}, {"_id": 1}))
    assert remaining == ["future", "no-date", "no-field"]


def test_expire_after_seconds_is_added(gw_db: Database, gw_client: MongoClient) -> None:
    coll = gw_db.ttl
    coll.create_index("created_at", expireAfterSeconds=3600)
    now = dt.datetime.now(dt.UTC)
    coll.insert_many([{"_id": "stale", "created_at": now - dt.timedelta(hours=2)},
                      {"_id": "fresh", "created_at": now - dt.timedelta(minutes=5)}])
    gw_client.admin.command(EXPIRE_TTL_COMMAND)
    assert [d["_id"] for d in coll.find({}, {"_id": 1})] == ["fresh"]
