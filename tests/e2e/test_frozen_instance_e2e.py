"""An instance frozen past its lease (SIGSTOP) and resumed: its late writes are fenced (issue 30).

Two gunicorn ``main:app`` services on one store, leases of 4 s. The first
runs an ordered event (seq 5) and its worker is stopped with SIGSTOP in the
middle of the handler, as a stopped VM or a long GC pause would stop it: no
heartbeat, no renewal. Once its claim and its entity hold have lapsed on the
store's clock, Pub/Sub's redelivery of seq 5 goes to the second instance,
which takes both over and finishes it; an older event (seq 4) then arrives
there and is stale. Then the first worker resumes (SIGCONT) and finishes its
handler: its finish and its release must be refused (``lease_lost``, 503),
the event must stay the second instance's SUCCESS and the entity's position
must stay 5.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pymongo.database import Database

from tests.e2e import skew_handlers, support
from tests.e2e.harness import ServiceProcess, free_port, group_processes, wait_until

LEASE_SECONDS = 4
RUN_SECONDS = 2.0


def workers_of(service: ServiceProcess) -> list[int]:
    """The gunicorn workers of ``service`` (its group, without the master)."""
    assert service.process is not None
    master = service.process.pid
    return [p.pid for p in group_processes(master) if p.pid != master]


def test_a_worker_frozen_past_its_lease_is_fenced_when_it_resumes(
        service: Callable[..., ServiceProcess], mongo_uri: str, mongo_db: Database) -> None:
    env = support.service_env(
        mongo_uri, mongo_db.name, f"127.0.0.1:{free_port()}",
        EVENTBUS_HANDLER_MODULES="tests.e2e.skew_handlers",
        EVENTBUS_LEASE_SECONDS=str(LEASE_SECONDS), EVENTBUS_ORDER_WAIT_SECONDS="1",
        EVENTBUS_PARTNER_CONCURRENCY_WAIT_SECONDS="1")
    with ThreadPoolExecutor(max_workers=2) as pool:
        frozen, other = (f.result() for f in [pool.submit(service, env=env, workers=1),
                                               pool.submit(service, env=env, workers=1)])
    entity = f"frozen-{uuid.uuid4().hex[:10]}"

    def delivery(seq: int, message_id: str) -> tuple[bytes, str]:
        return support.ordered_delivery(skew_handlers.ORDERED, entity, seq, message_id,
                                        sleep=RUN_SECONDS)

    first, key = delivery(5, "m-5")
    redelivery, _ = delivery(5, "m-5-again")
    older, older_key = delivery(4, "m-4")
    runs = mongo_db[skew_handlers.ORDERED_RUNS]
    stopped = workers_of(frozen)
    assert stopped, "no gunicorn worker to stop"
    with ThreadPoolExecutor(max_workers=1) as pool:
        late = pool.submit(support.post, frozen.url, first)
        wait_until(lambda: runs.find_one({"_id": entity, "started": 5}), timeout=15,
                   message="seq 5's handler to start on the first instance")
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(LEASE_SECONDS * 2)  # the claim and the hold lapse on the store's clock
            taken = support.post(other.url, redelivery)
            stale = support.post(other.url, older)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        late_status, late_answer = late.result(timeout=30)

    assert (taken[0], taken[1].get("outcome")) == (200, "processed"), taken
    assert (stale[0], stale[1].get("outcome")) == (200, "stale"), stale
    assert (late_status, late_answer.get("outcome")) == (503, "lease_lost"), late_answer
    record = support.record_of(mongo_db, key)
    assert record is not None
    assert (record["event_status"], record["attempts"]) == ("SUCCESS", 2), record
    older_record = support.record_of(mongo_db, older_key)
    assert older_record is not None and older_record["event_status"] == "SUCCESS", older_record
    assert (older_record["stale"]["position"], older_record["stale"]["applied_position"]) == \
        (4, 5), older_record
    assert support.stored_position(mongo_db, entity) == 5
    seen = runs.find_one({"_id": entity}) or {}
    assert seen.get("started") == [5, 5] and sorted(seen.get("finished", [])) == [5, 5], seen
