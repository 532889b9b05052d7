"""Two service instances on one store, one with its wall clock 10 minutes off (issue 30).

Each test starts two gunicorn ``main:app`` services on the same fresh MongoDB
database; one of them runs with its wall clock shifted by libfaketime
(``clock_shift``: +10 min, or -10 min in the second variant), as a host whose
clock drifted would. Deliveries are POSTed straight to one instance or the
other (wrapped push bodies, as Pub/Sub sends them), so the test chooses which
instance sees what and when.

Every lease, hold and guard must be decided on **the store's clock**: then the
instances' clocks do not matter. A lease written with one instance's clock and
read with another's does: to the instance whose clock is ahead, a live lease
of the other looks 10 minutes expired. So the first delivery always goes to
the instance whose clock is **behind**, and the one that must keep its hands
off goes to the instance that is **ahead**:

* a duplicate delivery arrives while the first delivery's slow guarded partner
  call runs: the partner is called once, the duplicate is answered non-2xx
  (in progress, to be redelivered) and changes nothing;
* an older ordered event arrives while a newer event of the same entity runs:
  it never runs beside it, never after it, and the entity's stored position
  never goes back.

The leases here (10 s) are far longer than the partner call and the handlers
(3 s): on one clock, no lease ever runs out in these tests.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from pymongo.database import Database

from handlers.partners import idempotency_header
from tests.e2e import skew_handlers, support
from tests.e2e.harness import ClockShift, ServiceProcess, free_port, wait_until
from tests.partner_server import PartnerServer, Slow

SHIFT_SECONDS = 600
LEASE_SECONDS = 10
RUN_SECONDS = 3.0
"""How long the slow partner call, and each ordered handler, takes."""


@dataclasses.dataclass(frozen=True)
class Instances:
    """The two services: ``behind`` has the earlier wall clock, ``ahead`` the later."""

    behind: ServiceProcess
    ahead: ServiceProcess
    shift: int
    """The shifted instance's offset: + (it is ``ahead``), - (it is ``behind``) or 0 (none is)."""


@pytest.fixture
def partner() -> Iterator[PartnerServer]:
    """A partner whose first call takes ``RUN_SECONDS``; later calls answer 200 at once."""
    with PartnerServer([Slow(RUN_SECONDS)]) as server:
        yield server


@pytest.fixture(params=[SHIFT_SECONDS, -SHIFT_SECONDS, 0],
                ids=["ahead-10min", "behind-10min", "same-clock"])
def instances(request: pytest.FixtureRequest, service: Callable[..., ServiceProcess],
              clock_shift: ClockShift, mongo_uri: str, mongo_db: Database,
              partner: PartnerServer) -> Instances:
    """Two services on ``mongo_db``, the second with its wall clock shifted by the param.

    With 0, neither is shifted: the control, which shows that what the tests
    expect is what the service does when the clocks agree.
    """
    shift: int = request.param
    # Nothing here publishes (no relay, no forward); an address where nothing
    # listens makes sure no message could reach a real project if something did.
    env = support.service_env(
        mongo_uri, mongo_db.name, f"127.0.0.1:{free_port()}",
        EVENTBUS_HANDLER_MODULES="tests.e2e.skew_handlers",
        EVENTBUS_LEASE_SECONDS=str(LEASE_SECONDS), EVENTBUS_PARTNER_URL=partner.template)
    # Started side by side: each start is mostly gunicorn importing the app.
    with ThreadPoolExecutor(max_workers=2) as pool:
        starting = [pool.submit(service, env=env, workers=1),
                    pool.submit(service, env={**env, **clock_shift.env(shift)} if shift else env,
                                workers=1)]
        plain, shifted = (future.result() for future in starting)
    assert_clock_shifted(shifted, plain, shift)
    if shift >= 0:
        return Instances(behind=plain, ahead=shifted, shift=shift)
    return Instances(behind=shifted, ahead=plain, shift=shift)


def assert_clock_shifted(shifted: ServiceProcess, plain: ServiceProcess, shift: int) -> None:
    """Check that the shift reached the shifted service's worker, from its own request log.

    Without this, a shift that did not apply would let every test below pass
    on any code.
    """
    stamps = {}
    for name, instance in (("shifted", shifted), ("plain", plain)):
        status, _ = support.post(instance.url, b"{}")  # not a delivery: 400, and one log line
        assert status == 400
        line = wait_until(functools.partial(support.request_lines, instance), timeout=10,
                          message=f"the {name} service's request log line")[-1]
        stamps[name] = _epoch(line["timestamp"])
    # The two requests were made within seconds of each other; 30 s is far below the shift.
    assert abs(stamps["shifted"] - stamps["plain"] - shift) < 30, (stamps, shift)


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_a_duplicate_during_a_slow_guarded_call_calls_the_partner_once(
        instances: Instances, partner: PartnerServer, mongo_db: Database) -> None:
    name = f"skew-{uuid.uuid4().hex[:10]}"
    payload = support.event(skew_handlers.PARTNER_CALL, tag=name, kind="skew", payload={"n": 1})
    key = support.stored_key(payload, {"idempotency_key": name})
    first = support.wrapped_body(payload, "m-1", idempotency_key=name)
    duplicate = support.wrapped_body(payload, "m-2", idempotency_key=name)  # a redelivery

    with ThreadPoolExecutor(max_workers=1) as pool:
        running: Future[tuple[int, dict[str, Any]]] = pool.submit(
            support.post, instances.behind.url, first)
        # The partner has the first call: the guard is taken and the call is on the wire.
        wait_until(lambda: partner.calls, timeout=15, message="the first delivery's partner call")
        before = held_state(mongo_db, key)
        assert before["record"]["event_status"] == "PROCESSING" and before["guards"], before
        status, answer = support.post(instances.ahead.url, duplicate)
        after = held_state(mongo_db, key)
        # The test means nothing if the first call ended before the duplicate was answered.
        assert not running.done(), "the slow partner call ended before the duplicate's answer"
        first_status, first_answer = running.result(timeout=30)

    calls = [call.key for call in partner.calls]
    assert calls == [idempotency_header(key)], (
        f"the partner was called {len(calls)} times for one event; the duplicate was "
        f"answered {status} {answer}")
    assert not 200 <= status < 300, f"the duplicate was acked: {status} {answer}"
    assert answer.get("outcome") == "in_progress", answer
    assert after == before, "the duplicate changed the record or the guard of a running event"
    assert (first_status, first_answer.get("outcome")) == (200, "processed"), first_answer
    record = support.record_of(mongo_db, key)
    assert record is not None
    assert (record["event_status"], record["attempts"]) == ("SUCCESS", 1), record


def held_state(db: Database, key: str) -> dict[str, Any]:
    """``key``'s record and the guards' records, without their times.

    Times are left out because the running instance's heartbeat may renew a
    lease at any moment; every other field (status, owner, attempts, result)
    is kept, so any change the duplicate made shows.
    """
    return {"record": _timeless(support.record_of(db, key)),
            "guards": [_timeless(guard) for guard in db.side_effects.find()]}


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _timeless(item) for name, item in value.items()
                if not isinstance(item, datetime)}
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    return value


def test_an_older_ordered_event_during_a_newer_ones_run_changes_nothing(
        instances: Instances, mongo_db: Database) -> None:
    entity = f"skew-{uuid.uuid4().hex[:10]}"

    def delivery(seq: int, message_id: str) -> tuple[bytes, str]:
        return support.ordered_delivery(skew_handlers.ORDERED, entity, seq, message_id,
                                        sleep=RUN_SECONDS)

    newer, newer_key = delivery(5, "m-5")
    older, older_key = delivery(3, "m-3")
    runs = mongo_db[skew_handlers.ORDERED_RUNS]
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(support.post, instances.behind.url, newer)
        wait_until(lambda: runs.find_one({"_id": entity, "started": 5}), timeout=15,
                   message="seq 5's handler to start")
        status, answer = support.post(instances.ahead.url, older)
        newer_status, newer_answer = running.result(timeout=30)
    # Pub/Sub redelivers what was not acked; by now seq 5 is applied, so seq 3 is stale.
    if not 200 <= status < 300:
        status, answer = support.post(instances.ahead.url, older)

    seen = runs.find_one({"_id": entity}) or {}
    position = support.stored_position(mongo_db, entity)
    assert position == 5, (
        f"the entity's stored position is {position}, after seq 5 was applied; "
        f"handler runs: started {seen.get('started')}, finished {seen.get('finished')}")
    assert seen.get("started") == [5], (
        f"seq 3 ran after or beside seq 5: started {seen.get('started')}, "
        f"at most {seen.get('most_at_once')} at once")
    assert seen.get("most_at_once") == 1, seen
    assert (newer_status, newer_answer.get("outcome")) == (200, "processed"), newer_answer
    assert 200 <= status < 300, f"seq 3, redelivered after seq 5: {status} {answer}"
    older_record = support.record_of(mongo_db, older_key)
    newer_record = support.record_of(mongo_db, newer_key)
    assert older_record is not None and newer_record is not None
    assert (older_record["event_status"], bool(older_record.get("stale"))) == ("SUCCESS", True), \
        older_record
    assert newer_record["event_status"] == "SUCCESS", newer_record
