"""The simulation on the local MongoDB-compatible server: a smaller seed budget (issue 39).

The same worlds, actors, faults and ledger as ``test_simulation``, with the
store a ``MongoEventStore`` whose clock follows the virtual one
(``tests.sim.mongo``): every lease, hold, fence and due time is decided by
the server's ``$$NOW`` at the simulated moment, as in production. A run on
MongoDB takes its own paths (e.g. a redelivered ordered event's claim holds
its entity in a second call, ``take_entities``, where the memory store holds
it in the claim), so its seeds are not the memory budget's runs again.

``SIM_MONGO_RUNS`` seeds (default 60) from ``SIM_MONGO_FIRST`` (default
100000, away from the memory budget's), in ``CHUNKS`` items. A run's store
calls are round trips of a few milliseconds on loopback, and the server's
clock runs on by those milliseconds between two calls, so a lease the
scheduler lets lapse to within a few milliseconds of its end could decide
differently on a slower machine; the virtual times are continuous draws, so
that is rare, and a verdict it changed would still be a real interleaving.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pymongo.database import Database

from eventbus.store.mongo import MongoEventStore
from tests.sim.mongo import SIM_START, mongo_store
from tests.sim.runner import play, report, shrink

pytestmark = [pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]
"""A crashed instance's loop dies with coroutines it never ran (and their selectors)."""

RUNS = int(os.environ.get("SIM_MONGO_RUNS", "60"))
FIRST = int(os.environ.get("SIM_MONGO_FIRST", "100000"))
CHUNKS = max(1, min(4, RUNS // 30))


def _chunk(index: int) -> range:
    size = -(-RUNS // CHUNKS)
    start = FIRST + index * size
    return range(start, min(FIRST + RUNS, start + size))


@pytest.mark.parametrize("index", range(CHUNKS))
def test_seeds_on_mongodb(index: int, mongo_db: Database[Any]) -> None:
    """Every seed of the chunk keeps every promise of the ledger, on MongoDB."""
    made: list[MongoEventStore] = []
    where = {"store": mongo_store(mongo_db, made), "start": SIM_START}
    seeds = _chunk(index)
    tally = play(seeds, **where)
    assert tally.runs == len(seeds) and len(made) == len(seeds)
    # The worlds reached the server's store and its faults: a crash, a pause and a
    # failover at some store call of the chunk.
    assert tally.points["store-before"] > 0 and tally.points["store-after"] > 0
    assert min(tally.decisions[kind] for kind in ("crash", "pause", "unavailable")) > 0
    if tally.failures:
        seed = min(tally.failures)
        others = ", ".join(f"{s} ({f})" for s, f in sorted(tally.failures.items()))
        pytest.fail(f"{len(tally.failures)} seed(s) broke a promise on MongoDB: {others}\n\n"
                    f"{report(shrink(seed, budget=20, **where))}\n\n"
                    "Again: run_seed(seed, store=mongo_store(db, []), start=SIM_START) "
                    "(tests.sim.mongo); keep it in tests/sim/test_examples.py.", pytrace=False)
