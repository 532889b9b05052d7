"""The guarded partner call against a real local HTTP server that fails on cue.

``handlers.partners.PartnerClient`` on ``eventbus.guard.Guard`` over the in-memory
store; the guard record is ``store.guard_get(key)`` (the ``side_effects``
collection of a MongoDB store): status SUCCESS/FAILED/PROCESSING, ``result``
(``status_code``, ``url``) on success, ``error`` (``type``, ``message``,
``classification``) on failure. The guard alone, with a plain function as
its effect, is tested at the end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import time
from typing import Any

import pytest

from eventbus.guard import Guard
from eventbus.model.errors import LeaseHeld, TransientError
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import FakeClock
from handlers.partners import PartnerClient, PartnerRejected, PartnerUnavailable, classify_status
from tests import hostile_server as hostile
from tests.partner_server import PartnerServer, Slow, Trickle

KEY = "order-1:OR_MGMT:abc/0:PARTNER_NOTIFY"
BODY = {"kind": "order-status", "payload": {"orderId": 1}}
LEASE = dt.timedelta(seconds=60)


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC))


@pytest.fixture()
def store(clock: FakeClock) -> MemoryEventStore:
    return MemoryEventStore(clock=clock)  # leases run on the clock the tests move


def client(store: MemoryEventStore, clock: FakeClock, timeout: float = 2.0) -> PartnerClient:
    return PartnerClient(Guard(store, lease=LEASE, now=clock), timeout=timeout)


def record(store: MemoryEventStore, key: str = KEY) -> dict[str, Any]:
    found = store.guard_get(key)
    assert found is not None
    return found


def free_port() -> int:
    """Return a local port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(("status", "kind"), [
    (200, "delivered"), (201, "delivered"), (204, "delivered"),
    (400, "permanent"), (401, "permanent"), (404, "permanent"), (409, "permanent"),
    (408, "transient"), (429, "transient"), (500, "transient"), (503, "transient"),
    (302, "transient"),
])
def test_statuses_are_classified(status: int, kind: str) -> None:
    assert classify_status(status) == kind


def test_a_2xx_sets_the_key_for_good_and_the_next_call_is_skipped(
        store: MemoryEventStore, clock: FakeClock) -> None:
    with PartnerServer([201]) as partner:
        first = client(store, clock).deliver(KEY, partner.url + "/events", BODY)
        again = client(store, clock).deliver(KEY, partner.url + "/events", BODY)
    assert (first.status_code, first.skipped) == (201, False)
    assert (again.status_code, again.skipped) == (201, True)
    (call,) = partner.calls
    assert call.key == KEY and call.body == BODY
    assert call.headers["Content-Type"] == "application/json"
    stored = record(store)
    assert stored["status"] == "SUCCESS" and "error" not in stored
    assert stored["result"] == {"status_code": 201, "url": partner.url + "/events"}
    assert "lease_owner" not in stored and "lease_until" not in stored


def test_a_refused_connection_is_transient_and_releases_the_lease(
        store: MemoryEventStore, clock: FakeClock) -> None:
    url = f"http://127.0.0.1:{free_port()}/events"  # nothing listens there
    with pytest.raises(PartnerUnavailable, match="ConnectionError"):
        client(store, clock).deliver(KEY, url, BODY)
    stored = record(store)
    assert (stored["status"], stored["error"]["classification"]) == ("FAILED", "transient")
    assert stored["error"]["type"] == "PartnerUnavailable"
    assert "result" not in stored  # no answer, so no status code
    assert "lease_owner" not in stored and stored["attempts"] == 1
    # The lease is released: the next try runs at once, without waiting for it to expire.
    with PartnerServer() as partner:
        assert not client(store, clock).deliver(KEY, partner.url, BODY).skipped
    assert len(partner.calls) == 1 and record(store)["attempts"] == 2


def test_a_timeout_is_transient(store: MemoryEventStore, clock: FakeClock) -> None:
    with PartnerServer([Slow(1.0)]) as partner, \
            pytest.raises(PartnerUnavailable, match=r"Timeout|DeadlineExceeded"):
        client(store, clock, timeout=0.2).deliver(KEY, partner.url, BODY)
    assert record(store)["error"]["classification"] == "transient"


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_trickling_partner_ends_within_the_total_deadline_and_is_retried(
        store: MemoryEventStore, clock: FakeClock, headers_too: bool) -> None:
    # One byte a second never trips a per-read timeout: only a deadline on the
    # whole call ends it (it took 18 s with a 3 s timeout before).
    with PartnerServer([Trickle(every=0.5, headers_too=headers_too)], then=200) as partner:
        started = time.monotonic()
        with pytest.raises(PartnerUnavailable, match=r"within 1\.5 s"):
            client(store, clock, timeout=1.5).deliver(KEY, partner.url, BODY)
        took = time.monotonic() - started
        failed = record(store)
        retried = client(store, clock, timeout=1.5).deliver(KEY, partner.url, BODY)
    assert took < 1.5 + 0.5, f"the call took {took:.1f} s"
    assert failed["status"] == "FAILED" and failed["error"]["classification"] == "transient"
    assert (retried.status_code, retried.skipped) == (200, False)
    assert [c.status for c in partner.calls] == [200, 200] and record(store)["attempts"] == 2


@pytest.mark.parametrize("closing", [{"version": "HTTP/1.0"}, {"close": True}],
                         ids=["HTTP/1.0", "Connection: close"])
def test_a_partner_trickling_over_a_closing_connection_ends_within_the_deadline(
        store: MemoryEventStore, clock: FakeClock, closing: dict[str, Any]) -> None:
    # The attack of issue 24: headers, then a byte every 0.2 s, then close (12 s in all);
    # urllib3 hands such a socket to the answer, and the call was held to the end.
    with hostile.HostileServer(hostile.trickle_body(0.2, **closing)) as partner:
        started = time.monotonic()
        with pytest.raises(PartnerUnavailable, match=r"DeadlineExceeded.*within 0\.5 s"):
            client(store, clock, timeout=0.5).deliver(KEY, partner.url, BODY)
        took = time.monotonic() - started
    assert took < 2.0, f"the call took {took:.1f} s"
    assert record(store)["error"]["classification"] == "transient"


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "SUCCESS"), (400, "permanent"), (503, "transient")])
def test_an_answer_over_the_cap_is_classified_by_its_status(
        store: MemoryEventStore, clock: FakeClock, status: int, outcome: str) -> None:
    big = b"x" * (4 * 1024 * 1024)  # four times the cap: cut after the first MiB
    with hostile.HostileServer(hostile.answer(status, big, framing="chunked")) as partner:
        started = time.monotonic()
        with contextlib.suppress(PartnerRejected, PartnerUnavailable):
            client(store, clock).deliver(KEY, partner.url, BODY)
        took = time.monotonic() - started
    found = record(store)
    assert took < 2.0 and len(partner.requests) == 1
    if outcome == "SUCCESS":
        assert (found["status"], found["result"]["status_code"]) == ("SUCCESS", 200)
    else:
        assert found["status"] == "FAILED" and found["error"]["classification"] == outcome


def test_a_503_is_retried_and_the_retry_delivers_once(
        store: MemoryEventStore, clock: FakeClock) -> None:
    with PartnerServer([503], then=200) as partner:
        with pytest.raises(PartnerUnavailable, match="503"):
            client(store, clock).deliver(KEY, partner.url, BODY)
        failed = record(store)
        assert failed["status"] == "FAILED" and "answered 503" in failed["error"]["message"]
        delivered = client(store, clock).deliver(KEY, partner.url, BODY)
        client(store, clock).deliver(KEY, partner.url, BODY)
    assert delivered.status_code == 200 and not delivered.skipped
    assert [c.status for c in partner.calls] == [503, 200]
    assert partner.successes() == {KEY: 1}
    stored = record(store)
    assert stored["status"] == "SUCCESS" and stored["attempts"] == 2
    assert stored["result"]["status_code"] == 200 and "error" not in stored


@pytest.mark.parametrize("status", [408, 429, 500])
def test_other_retryable_answers_are_transient(store: MemoryEventStore, clock: FakeClock,
                                               status: int) -> None:
    with PartnerServer([status]) as partner, pytest.raises(PartnerUnavailable):
        client(store, clock).deliver(KEY, partner.url, BODY)
    assert record(store)["error"]["classification"] == "transient"


def test_a_400_is_permanent_and_recorded(store: MemoryEventStore, clock: FakeClock) -> None:
    with PartnerServer([400]) as partner, pytest.raises(PartnerRejected, match="400"):
        client(store, clock).deliver(KEY, partner.url, BODY)
    stored = record(store)
    assert (stored["status"], stored["error"]["classification"]) == ("FAILED", "permanent")
    assert stored["error"]["type"] == "PartnerRejected"
    assert "answered 400" in stored["error"]["message"]


def test_a_live_lease_held_elsewhere_is_transient_and_makes_no_call(
        store: MemoryEventStore, clock: FakeClock) -> None:
    # Another worker took the lease and is (as far as anyone knows) still calling.
    assert store.guard_take(KEY, "other", clock(), dt.timedelta(seconds=30)) is None
    assert record(store)["status"] == "PROCESSING"
    with PartnerServer() as partner:
        with pytest.raises(LeaseHeld) as caught:
            client(store, clock).deliver(KEY, partner.url, BODY)
        assert isinstance(caught.value, TransientError) and partner.calls == []
        clock.advance(31)  # the other worker died: its lease runs out
        assert not client(store, clock).deliver(KEY, partner.url, BODY).skipped
    assert len(partner.calls) == 1 and record(store)["status"] == "SUCCESS"


# -- the guard alone, with a plain function as its effect ------------------------------------

def test_the_guard_runs_an_effect_once_and_remembers_its_result(
        store: MemoryEventStore, clock: FakeClock) -> None:
    guard = Guard(store, lease=LEASE, now=clock)
    runs: list[int] = []

    def effect() -> dict[str, Any]:
        runs.append(1)
        return {"sent": len(runs)}

    first = guard.run("mail-1", effect)
    clock.advance(5)
    again = guard.run("mail-1", effect)
    other = guard.run("mail-2", effect)
    assert (first.key, dict(first.result), first.skipped) == ("mail-1", {"sent": 1}, False)
    assert (dict(again.result), again.skipped) == ({"sent": 1}, True)
    assert (dict(other.result), other.skipped) == ({"sent": 2}, False)
    assert len(runs) == 2
    stored = record(store, "mail-1")
    assert (stored["status"], stored["result"], stored["attempts"]) == ("SUCCESS", {"sent": 1}, 1)
    assert stored["done_at"] == clock.moment - dt.timedelta(seconds=5)


def test_a_failing_effect_is_recorded_with_its_classification_and_reraised(
        store: MemoryEventStore, clock: FakeClock) -> None:
    guard = Guard(store, lease=LEASE, now=clock)
    calls: list[int] = []

    def failing() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("bad address")
        return {"ok": True}

    with pytest.raises(ValueError, match="bad address"):
        guard.run("mail-1", failing, classify=lambda exc: "permanent")
    stored = record(store, "mail-1")
    assert stored["status"] == "FAILED" and "lease_owner" not in stored
    assert stored["error"] == {"type": "ValueError", "message": "bad address",
                               "classification": "permanent"}
    # The guard stores the failure; whether to try again is the caller's decision.
    done = guard.run("mail-1", failing)
    assert (dict(done.result), done.skipped, len(calls)) == ({"ok": True}, False, 2)
    stored = record(store, "mail-1")
    assert stored["status"] == "SUCCESS" and "error" not in stored and stored["attempts"] == 2


def test_the_guard_default_classification_is_transient(
        store: MemoryEventStore, clock: FakeClock) -> None:
    def down() -> dict[str, Any]:
        raise ConnectionError("smtp down")

    with pytest.raises(ConnectionError):
        Guard(store, lease=LEASE, now=clock).run("mail-1", down)
    assert record(store, "mail-1")["error"]["classification"] == "transient"


def test_a_live_lease_blocks_the_guard_until_it_expires(
        store: MemoryEventStore, clock: FakeClock) -> None:
    guard = Guard(store, lease=LEASE, now=clock)
    assert store.guard_take("mail-1", "other", clock(), dt.timedelta(seconds=30)) is None
    with pytest.raises(LeaseHeld):
        guard.run("mail-1", lambda: {"ran": True})
    clock.advance(31)
    assert guard.run("mail-1", lambda: {"ran": True}).result == {"ran": True}


@pytest.mark.parametrize("header", ["120", "Wed, 21 Oct 2026 07:28:00 GMT"])
@pytest.mark.parametrize("status", [429, 503])
def test_a_partner_asking_to_come_back_later_raises_its_retry_after(
        store: MemoryEventStore, clock: FakeClock, status: int, header: str) -> None:
    from eventbus.model.errors import RetryAfter
    from tests.partner_server import Later

    with PartnerServer([Later(status, header)]) as partner, \
            pytest.raises(PartnerUnavailable) as failed:
        client(store, clock).deliver(KEY, partner.url, BODY)
    asked = failed.value.__cause__
    assert isinstance(asked, RetryAfter)  # the processor defers the event to that time
    assert asked.when == (120.0 if header == "120" else
                          dt.datetime(2026, 10, 21, 7, 28, tzinfo=dt.UTC))
    assert record(store)["status"] == "FAILED"  # the guard let the key go: it runs again


def test_a_retry_after_on_another_status_or_unreadable_is_an_ordinary_failure(
        store: MemoryEventStore, clock: FakeClock) -> None:
    from tests.partner_server import Later

    for action in (Later(500, "120"), Later(429, "soon")):
        with PartnerServer([action]) as partner, pytest.raises(PartnerUnavailable) as failed:
            client(store, clock).deliver(f"{KEY}-{action.status}", partner.url, BODY)
        assert failed.value.__cause__ is None
