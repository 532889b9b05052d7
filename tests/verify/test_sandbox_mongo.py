"""The sandbox on a real MongoDB store: verify reads, and changes nothing, byte for byte.

The partner app's demo runs on ``MongoEventStore`` (with a local partner
stub that counts its calls); then ``eventbus verify`` and ``eventbus verify
--record-sample`` run on that store. Every collection of the database (the
events, the side effects, the breakers, the handlers' projections) is the
same BSON afterwards, the partner was not called again, and no publisher
was asked for (``cli_run`` fails the test if one is).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import bson
import mongomock
from pymongo.database import Database

from eventbus.model.router import Router
from eventbus.rebuild.verify import StoreLookups, Verifier, parse_sample
from eventbus.store.mongo import MongoEventStore
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import FakeClock, LocalBus
from handlers import create_router
from handlers.settings import AppSettings, PartnerSettings
from tests.partner_server import PartnerServer
from tests.verify.recording import DEMO, cli_run


def snapshot(database: Database) -> dict[str, list[bytes]]:
    """Every document of every collection, as BSON, in ``_id`` order."""
    return {name: [bson.encode(doc) for doc in database[name].find().sort("_id", 1)]
            for name in sorted(database.list_collection_names())}


def test_verify_on_mongo_changes_nothing_and_calls_no_one(store: MongoEventStore,
                                                          mongo_db: Database,
                                                          tmp_path: Path) -> None:
    with PartnerServer() as partner:
        router = create_router(AppSettings(partners=PartnerSettings(url=partner.template)))
        # Two hours back: the server's TTL monitor deletes records from the past.
        clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2))
        with LocalBus(router, store, clock=clock) as bus:
            for spec in json.loads(DEMO.read_text())[:12]:
                if "raw" not in spec:
                    bus.publish(spec["event_type"], spec.get("data", {}), entity=spec["entity"],
                                version=spec.get("event_version", "v1"),
                                ordering_key=spec.get("ordering_key"))
        calls = len(partner.calls)
        assert calls > 0 and mongo_db["side_effects"].count_documents({}) > 0
        before = snapshot(mongo_db)
        env = ("--app", "tests.verify.test_sandbox_mongo:app_router")
        code, out, err = cli_run(store, "verify", *env)
        assert code == 0, out + err
        assert " 0 different, 0 unverifiable" in out
        code, sample, err = cli_run(store, "verify", "--record-sample", "50", *env)
        assert code == 0, err
        assert snapshot(mongo_db) == before
        assert len(partner.calls) == calls
    # The sample recorded from mongo verifies on its own, with no store at all.
    read = parse_sample(sample.encode(), "sample")
    with Verifier(app_router(), read.lookups) as verifier:
        report = verifier.run(read.items)
    assert report.exit_code() == 0 and report.counts()["same"] > 0


def test_a_stored_guard_result_is_read_never_written(store: MongoEventStore,
                                                     mongo_db: Database) -> None:
    with PartnerServer() as partner:
        router = create_router(AppSettings(partners=PartnerSettings(url=partner.template)))
        clock = FakeClock(dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2))
        spec = next(s for s in json.loads(DEMO.read_text())
                    if s.get("data", {}).get("orderStatusLatest") == "OR_CNF")
        with LocalBus(router, store, clock=clock) as bus:
            bus.publish(spec["event_type"], spec["data"], entity=spec["entity"],
                        version=spec["event_version"], ordering_key=spec.get("ordering_key"))
        before, calls = snapshot(mongo_db), len(partner.calls)
        lookups = StoreLookups(store)
        records = sorted(store.find_events(_success(), limit=10), key=lambda r: r["created"])
        with Verifier(router, lookups,
                      databases=lambda: mongomock.MongoClient(tz_aware=True)["v"]) as verifier:
            report = verifier.run(records)
        assert report.counts()["same"] == len(records) == 3  # order, notify, notify-sent
        assert list(lookups.side_effects) == [r["idempotency_key"] for r in records
                                              if r["event_type"] == "PARTNER_NOTIFY"]
        assert snapshot(mongo_db) == before and len(partner.calls) == calls


def _success() -> EventQuery:
    return EventQuery(statuses=("SUCCESS",))


def app_router() -> Router:
    """The partner app, calling partners where nothing listens (verify must not call)."""
    return create_router(AppSettings(partners=PartnerSettings(
        url="http://127.0.0.1:9/partners/{partnerId}/events")))
