"""The guarded partner call against a real local HTTP server that fails on cue."""

from __future__ import annotations

import datetime as dt

import pytest
from pymongo.database import Database

from eventbus.delivery import COLLECTION, PartnerClient, classify_status
from eventbus.errors import LeaseHeld, PartnerRejected, PartnerUnavailable, TransientError
from tests.e2e.harness import free_port
from tests.partner_server import PartnerServer, Slow

KEY = "order-1:OR_MGMT:abc/0:PARTNER_NOTIFY"
BODY = {"kind": "order-status", "payload": {"orderId": 1}}


class Clock:
    def __init__(self) -> None:
        self.moment = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.moment


def client(db: Database, clock: Clock | None = None, timeout: float = 2.0) -> PartnerClient:
    return PartnerClient(db, timeout=timeout, lease=dt.timedelta(seconds=60),
                         now=clock or Clock())


def record(db: Database) -> dict:
    found = db[COLLECTION].find_one({"_id": KEY})
    assert found is not None
    return found


@pytest.mark.parametrize(("status", "kind"), [
    (200, "delivered"), (201, "delivered"), (204, "delivered"),
    (400, "permanent"), (401, "permanent"), (404, "permanent"), (409, "permanent"),
    (408, "transient"), (429, "transient"), (500, "transient"), (503, "transient"),
    (302, "transient"),
])
def test_statuses_are_classified(status: int, kind: str) -> None:
    assert classify_status(status) == kind


def test_a_2xx_sets_the_key_for_good_and_the_next_call_is_skipped(mongo_db: Database) -> None:
    with PartnerServer([201]) as partner:
        first = client(mongo_db).deliver(KEY, partner.url + "/events", BODY)
        again = client(mongo_db).deliver(KEY, partner.url + "/events", BODY)
    assert (first.status_code, first.skipped) == (201, False)
    assert (again.status_code, again.skipped) == (201, True)
    (call,) = partner.calls
    assert call.key == KEY and call.body == BODY
    assert call.headers["Content-Type"] == "application/json"
    stored = record(mongo_db)
    assert stored["status"] == "DELIVERED" and stored["classification"] == "delivered"
    assert stored["status_code"] == 201 and "lease_owner" not in stored


def test_a_refused_connection_is_transient_and_releases_the_lease(mongo_db: Database) -> None:
    url = f"http://127.0.0.1:{free_port()}/events"  # nothing listens there
    with pytest.raises(PartnerUnavailable, match="ConnectionError"):
        client(mongo_db).deliver(KEY, url, BODY)
    stored = record(mongo_db)
    assert (stored["status"], stored["classification"], stored["status_code"]) == \
        ("FAILED", "transient", None)
    assert "lease_owner" not in stored and stored["attempts"] == 1


def test_a_timeout_is_transient(mongo_db: Database) -> None:
    with PartnerServer([Slow(1.0)]) as partner, \
            pytest.raises(PartnerUnavailable, match="Timeout"):
        client(mongo_db, timeout=0.2).deliver(KEY, partner.url, BODY)
    assert record(mongo_db)["classification"] == "transient"


def test_a_503_is_retried_and_the_retry_delivers_once(mongo_db: Database) -> None:
    with PartnerServer([503], then=200) as partner:
        with pytest.raises(PartnerUnavailable, match="503"):
            client(mongo_db).deliver(KEY, partner.url, BODY)
        assert record(mongo_db)["status_code"] == 503
        delivered = client(mongo_db).deliver(KEY, partner.url, BODY)
        client(mongo_db).deliver(KEY, partner.url, BODY)
    assert delivered.status_code == 200 and not delivered.skipped
    assert [c.status for c in partner.calls] == [503, 200]
    assert partner.successes() == {KEY: 1}
    stored = record(mongo_db)
    assert stored["status"] == "DELIVERED" and stored["attempts"] == 2


@pytest.mark.parametrize("status", [408, 429, 500])
def test_other_retryable_answers_are_transient(mongo_db: Database, status: int) -> None:
    with PartnerServer([status]) as partner, pytest.raises(PartnerUnavailable):
        client(mongo_db).deliver(KEY, partner.url, BODY)
    assert record(mongo_db)["classification"] == "transient"


def test_a_400_is_permanent_and_recorded(mongo_db: Database) -> None:
    with PartnerServer([400]) as partner, pytest.raises(PartnerRejected, match="400"):
        client(mongo_db).deliver(KEY, partner.url, BODY)
    stored = record(mongo_db)
    assert (stored["status"], stored["classification"], stored["status_code"]) == \
        ("FAILED", "permanent", 400)


def test_a_live_lease_held_elsewhere_is_transient_and_makes_no_call(mongo_db: Database) -> None:
    clock = Clock()
    mongo_db[COLLECTION].insert_one({"_id": KEY, "status": "IN_FLIGHT", "lease_owner": "other",
                                     "lease_until": clock() + dt.timedelta(seconds=30)})
    with PartnerServer() as partner:
        with pytest.raises(LeaseHeld) as caught:
            client(mongo_db, clock).deliver(KEY, partner.url, BODY)
        assert isinstance(caught.value, TransientError) and partner.calls == []
        clock.moment += dt.timedelta(seconds=31)  # the other worker died: its lease runs out
        assert not client(mongo_db, clock).deliver(KEY, partner.url, BODY).skipped
    assert len(partner.calls) == 1 and record(mongo_db)["status"] == "DELIVERED"
