"""``eventbus verify --from-archive`` on a real MongoDB store: records first, nothing written.

Two orders run on ``MongoEventStore`` (their records are there), a third on
another bus (only the archive has it); all their bus messages are archived by
the test. Verify reads the two records and judges the third from the archive,
and every collection is the same BSON afterwards (``snapshot``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pymongo.database import Database

from eventbus.store.mongo import MongoEventStore
from eventbus.testing import FakeClock, LocalBus
from tests.verify.recording import cli_run
from tests.verify.test_from_archive import APP, BASE, ENTITY, archive, run
from tests.verify.test_sandbox_mongo import snapshot


def test_archived_events_verify_on_their_mongo_records_and_change_nothing(
        store: MongoEventStore, mongo_db: Database, tmp_path: Path) -> None:
    # Two hours back: the server's TTL monitor deletes records from the past.
    clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2))
    with LocalBus(BASE, store, clock=clock) as bus:
        for n in (0, 1):
            bus.publish("ORDER", {"n": n, "orderId": 100 + n}, entity=ENTITY)
            bus.clock.advance(1)
    _, elsewhere = run(BASE, [2])
    archive(tmp_path / "a.avro", [*bus.messages.values(), *elsewhere])
    before = snapshot(mongo_db)
    assert len(before["partner_events"]) == 6

    code, out, err = cli_run(store, "verify", "--from-archive", str(tmp_path), "--settle", "0",
                             *APP)
    assert code == 0, out + err
    assert "verified 9 events: 9 same" in out
    assert "(6 against their stored record, 3 against the archive)" in out

    code, out, _ = cli_run(store, "verify", "--from-archive", str(tmp_path), "--settle", "0",
                           "--app", "tests.verify.test_from_archive:RENAMED", "--type", "ORDER")
    assert code == 1 and "3 different" in out and "/0:STEP_C" in out
    assert snapshot(mongo_db) == before
