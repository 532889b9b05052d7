"""A growing collection gets planner statistics, and the owner-checked finish uses the key index.

Without statistics the engine ANDs every equality's index of a filter like the
service's owner-checked finish (key, lease owner, ``event_status``), walking the
``event_status`` index whose entries grow with every claim; a real MongoDB picks
the unique key. The server's autovacuum settings (``postgres.AUTOVACUUM_NAPTIME``)
must gather statistics while a collection grows, not a minute later.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.database import Database

from localdb import stats

DOCUMENTS = 5_500  # the local store had slowed to half its rate by about 5,000
STATS_WAIT_S = 30.0  # autovacuum wakes every 2 s; a minute (the old default) is too late

# The service's indexes on partner_events (eventbus.store.mongo.INDEXES), by name.
INDEXES = [
    IndexModel([("entity_metadata.partnerId", ASCENDING), ("created", DESCENDING)]),
    IndexModel([("event_status", ASCENDING), ("event_type", ASCENDING)]),
    IndexModel([("expire_at", ASCENDING)], expireAfterSeconds=0),
    IndexModel([("entity_metadata.entity_id", ASCENDING),
                ("entity_metadata.entity_type", ASCENDING)]),
    IndexModel([("idempotency_key", ASCENDING)], unique=True),
    IndexModel([("outbox.status", ASCENDING)]),
    IndexModel([("redrive_at", ASCENDING)]),
]


def owner_filter(key: str, owner: str) -> dict[str, Any]:
    """The service's owner-checked finish filter (eventbus.store.documents.owner_filter)."""
    return {"idempotency_key": key, "lease_owner": owner, "event_status": "PROCESSING"}


def claim_and_finish(db: Database, i: int) -> None:
    """A claim (an upsert taking the lease) and its owner-checked finish, as the service does."""
    key, owner = f"key-{i}", uuid.uuid4().hex
    db.events.update_one({"idempotency_key": key},
                         {"$set": {"event_status": "PROCESSING", "lease_owner": owner,
                                   "event_type": "OR_MGMT", "created": str(i),
                                   "entity_metadata": {"partnerId": f"p{i % 7}",
                                                       "entity_id": f"e{i}"}}},
                         upsert=True)
    finish = {"$set": {"event_status": "SUCCESS"}, "$unset": {"lease_owner": ""}}
    done = db.events.update_one(owner_filter(key, owner), finish)
    assert done.matched_count == 1


def wait_for_statistics(pg_dsn: str, namespace: str) -> stats.CollectionStats | None:
    """The collection's statistics once current, or the last seen after STATS_WAIT_S."""
    deadline, seen = time.monotonic() + STATS_WAIT_S, None
    while time.monotonic() < deadline:
        seen = next((s for s in stats.largest(pg_dsn, limit=50) if s.namespace == namespace),
                    None)
        if seen is not None and seen.current and seen.documents >= DOCUMENTS * 0.9:
            return seen
        time.sleep(0.5)
    return seen


def finish_plan_indexes(db: Database) -> list[str]:
    """The indexes in the engine's plan of the owner-checked filter (the gateway's explain)."""
    command = {"find": "events", "filter": owner_filter("key-17", "someone"), "limit": 1}
    plan = db.command({"explain": command})["queryPlanner"]["winningPlan"]["plan"]
    return re.findall(r'"Index Name": "([^"]+)"', json.dumps(plan))


def test_growing_collection_has_statistics_and_finish_uses_the_key_index(
        gw_db: Database, pg_dsn: str) -> None:
    gw_db.events.create_indexes(INDEXES)
    for i in range(DOCUMENTS):
        claim_and_finish(gw_db, i)
    found = wait_for_statistics(pg_dsn, f"{gw_db.name}.events")
    assert found is not None and found.current, \
        f"no current planner statistics {STATS_WAIT_S:.0f} s after growing: {found}"
    assert finish_plan_indexes(gw_db) == ["idempotency_key_1"]


def test_status_line_says_missing_before_any_analyze() -> None:
    never = stats.CollectionStats("app.events", 6_000, None, 6_000)
    assert not never.current
    assert never.describe().endswith("analyzed never (6,000 changes since): MISSING")
    current = stats.CollectionStats("app.events", 10_000, datetime(2026, 1, 1, tzinfo=UTC), 900)
    assert current.current and current.describe().endswith(": current")
    late = stats.CollectionStats("app.events", 10_000, datetime(2026, 1, 1, tzinfo=UTC), 3_000)
    assert not late.current and late.describe().endswith(": stale")

