"""The faults the model found, each kept as a short test of its own (issue 30's list).

Each test is the step sequence hypothesis shrank a failure to (or the issue's
own reproduction, in the model's terms), written out: a ``World`` of
instances with their clock offsets over one store (``tests.model.world``),
the steps, and the ledger's check (``World.check`` raises the broken
promise's family, ``tests.model.ledger``), plus the outcome the fix must give,
asserted directly. Both stores, unless the fault is one store's. The last
tests are holes beyond the issue's list: one the model's "nothing lost" rule
names (a replayed record nothing redrives), one its order rule names (a lane
that started on a hold lapsed behind another lane of its batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from eventbus.model.outcome import Outcome
from tests.model.world import LEASE_SECONDS, RATE_WINDOW, SETTINGS, Backend, Message, World

PAST_LEASE = 2 * round(LEASE_SECONDS / 2 + 1)
"""Even seconds just past one lease (the world's steps are even: see ``tests.model.world``)."""

MakeBackend = Callable[[], Backend]


@contextmanager
def world(make_backend: MakeBackend, *offsets: float) -> Iterator[World]:
    """A world of instances with these clock offsets; its threads end with the test."""
    built = World(make_backend(), offsets)
    try:
        yield built
    finally:
        built.close()


def last(world: World) -> Message:
    """The message the last step created."""
    return world.messages[-1]


def effects(world: World, guard: str) -> int:
    """How many times the guarded effect ``guard`` went out."""
    return len(world.ledger.invocations[guard])


def status(world: World, message: Message) -> str:
    """The stored status of ``message``'s record ("" when there is none)."""
    return str((world.store.get(message.key) or {}).get("event_status") or "")


# 1. Every lease compares two processes' clocks --------------------------------------
def test_a_duplicate_on_a_host_30s_ahead_never_calls_the_partner_twice(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 30.0) as w:
        w.new_call("fast", shared=False, emit=False, plan=["hang"])
        call = last(w)
        w.deliver(w.instances[0], [call])  # its partner call hangs, its lease renewed
        duplicate = w.deliver(w.instances[1], [call])  # the same push, to a host 30 s ahead
        assert duplicate.results is not None
        assert duplicate.results[0].outcome is Outcome.IN_PROGRESS  # held elsewhere: 503
        assert effects(w, "call:1") == 1
        w.check()
        w.settle()


# 2. Ordered handlers run side by side under skew ------------------------------------
def test_an_older_event_on_a_host_ahead_waits_for_the_newer_one(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 30.0) as w:
        w.new_order("e1", 5, plan=["hang"])
        five = last(w)
        w.deliver(w.instances[0], [five])  # seq 5 runs, its entity held
        w.new_order("e1", 3, plan=[])
        three = w.deliver(w.instances[1], [last(w)])  # seq 3 reaches a host 30 s ahead
        assert three.results is not None
        assert three.results[0].outcome is Outcome.IN_PROGRESS  # the entity is busy
        w.check()
        w.release(w.hangs[0])
        w.check()
        w.settle()


# 3. A hold that lapses while its holder lives loses a position ----------------------
def test_a_holder_frozen_past_its_lease_cannot_store_behind_the_next_holder(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 0.0) as w:
        w.new_order("e1", 5, plan=["hang"])
        five = last(w)
        w.deliver(w.instances[0], [five])
        w.freeze(w.instances[0])  # a GC pause: no heartbeat
        w.advance(PAST_LEASE)
        w.new_order("e1", 4, plan=["hang"])
        w.deliver(w.instances[1], [last(w)])  # the entity is free: seq 4 takes it and runs
        w.instances[0].frozen = False
        w.release(next(h for h in w.hangs if h.run.instance is w.instances[0]))  # 5 resumes
        w.check()
        w.release(w.hangs[0])  # seq 4 finishes
        w.check()
        w.settle()


def test_two_holders_dying_in_turn_lose_neither_ones_events(make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 0.0, 0.0) as w:
        w.new_order("e1", 5, plan=["hang"])
        w.deliver(w.instances[0], [last(w)])
        w.freeze(w.instances[0])
        w.advance(PAST_LEASE)
        w.new_order("e1", 4, plan=[])
        w.instances[1].store.arm(1, "after")  # dies holding the entity (its take, call 1)
        w.deliver(w.instances[1], [last(w)])
        assert w.instances[1].dead
        w.instances[0].frozen = False
        w.release(w.hangs[0])  # the first holder resumes and finishes seq 5
        w.advance(PAST_LEASE)
        w.new_order("e1", 3, plan=[])
        w.deliver(w.instances[2], [last(w)])  # the third holder must still see 5
        w.check()
        w.settle()


# 4. Parks are counted in a field that every claim deletes ----------------------------
def test_an_event_parked_more_than_max_attempts_is_not_given_up_unrun(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 0.0) as w:
        w.new_call("slow", shared=False, emit=False, plan=[])
        w.deliver(w.instances[0], [last(w)])  # spends slow's one call of this window
        w.new_call("slow", shared=False, emit=False, plan=[])
        parked = last(w)
        for _ in range(SETTINGS.max_attempts + 1):
            run = w.deliver(w.instances[0], [parked])
            assert run.results is not None and run.results[0].outcome is Outcome.PARKED
        w.instances[0].store.arm(0, "after")  # the next claim never finishes
        w.deliver(w.instances[0], [parked])
        w.advance(PAST_LEASE)  # past the lease and the rate window
        w.deliver(w.instances[1], [parked])
        w.check()
        assert status(w, parked) == "SUCCESS"  # one real attempt, well under the cap


# 5. A handed-back ordered event (PENDING) is outside the store-driven redrive --------
def test_an_event_handed_back_for_a_busy_entity_is_redriven(make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 0.0) as w:
        w.new_order("e1", 1, plan=["hang"])
        w.deliver(w.instances[0], [last(w)])
        w.new_order("e1", 2, plan=[])
        two = last(w)
        busy = w.deliver(w.instances[1], [two])
        assert busy.results is not None and busy.results[0].outcome is Outcome.IN_PROGRESS
        w.release(w.hangs[0])
        w.settle()  # Pub/Sub stops delivering it: only the store may bring it back
        assert status(w, two) == "SUCCESS"


# 6. The shared rate limit follows each instance's clock ------------------------------
def test_the_shared_rate_holds_across_two_hosts_30s_apart(make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 30.0) as w:
        for _ in range(4):
            for instance in w.instances:
                w.new_call("slow", shared=False, emit=False, plan=[])
                w.deliver(instance, [last(w)])
            w.advance(RATE_WINDOW)
        calls = len(w.ledger.calls["slow"])
        assert calls <= 4 + 1  # one a window over 4 windows (+1 at a boundary)
        w.check()


# 7. An upcaster that raises on an ordered route escapes the processor -----------------
def test_an_upcaster_that_raises_on_an_ordered_route_is_a_stored_outcome(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0) as w:
        w.new_order("e1", 1, plan=[], unreadable=True)
        unreadable = last(w)
        run = w.deliver(w.instances[0], [unreadable])
        assert run.error is None, f"Processor.run raised {run.error!r}"
        assert status(w, unreadable) == "FAILED"
        w.check()


# 8. The guard's lease is not renewed; a sweeper ahead redrives a running record -----
def test_a_partner_call_longer_than_the_lease_is_not_made_twice(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 0.0) as w:
        w.new_call("fast", shared=True, emit=False, plan=["hang"])
        w.deliver(w.instances[0], [last(w)])  # the call to the shared key hangs
        w.advance(PAST_LEASE + 10)  # the heartbeat renews the claim: does it renew the guard?
        w.new_call("fast", shared=True, emit=False, plan=[])
        w.deliver(w.instances[1], [last(w)])  # another event needs the same guarded call
        assert effects(w, "call:shared") == 1
        w.check()


def test_a_sweeper_ten_minutes_ahead_leaves_a_running_event_alone(
        make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0, 600.0) as w:
        w.new_call("fast", shared=False, emit=False, plan=["hang"])
        running = last(w)
        w.deliver(w.instances[0], [running])
        for _ in range(SETTINGS.redrive_max + 1):
            w.redrive(w.instances[1])
            w.advance(2 * round(SETTINGS.redrive_after_seconds / 2 + 1))
        w.check()
        w.release(w.hangs[0])
        w.check()
        assert status(w, running) == "SUCCESS"


# 9. Claim.previous is the record after the claim in a MongoDB batch --------------------
def test_a_parked_event_in_a_batch_spends_no_attempt(make_backend: MakeBackend) -> None:
    with world(make_backend, 0.0) as w:
        w.new_call("slow", shared=False, emit=False, plan=[])
        w.deliver(w.instances[0], [last(w)])  # spends slow's one call of this window
        w.new_call("slow", shared=False, emit=False, plan=[])
        parked = last(w)
        for _ in range(SETTINGS.max_attempts + 1):
            w.new_call("fast", shared=False, emit=False, plan=[])  # a batch of two
            run = w.deliver(w.instances[0], [parked, last(w)])
            assert run.results is not None and run.results[0].outcome is Outcome.PARKED
            w.check()
        # A second past the token's time: on a real server the world's clock is only read
        # to a few ms, and the token comes exactly a window after the call that spent it.
        w.advance(RATE_WINDOW + 1)
        w.deliver(w.instances[0], [parked])
        w.check()
        assert status(w, parked) == "SUCCESS"



# Beyond the nine: found by the model's "nothing lost" rule -----------------------
def test_a_replayed_event_whose_message_is_lost_is_still_redriven(
        make_backend: MakeBackend) -> None:
    # A replay reopens the record FAILED-retryable with no redrive_at: if the message it
    # published never gets stored (its delivery died before the claim, and the broker's
    # retention ran out), the store-driven redrive never sees it.
    with world(make_backend, 0.0, 0.0) as w:
        w.new_call("fast", shared=False, emit=False, plan=["permanent"])
        refused = last(w)
        w.deliver(w.instances[0], [refused])
        assert w.replay(w.instances[0], w.store.get(refused.key) or {}) == "replayed"
        w.instances[1].store.arm(0, "before")  # the replayed message's delivery dies
        w.deliver(w.instances[1], [last(w)])
        w.settle()
        assert status(w, refused) == "SUCCESS"


def test_a_lane_behind_a_hung_handler_of_its_batch_gives_its_events_back_once_its_hold_lapsed(
        make_backend: MakeBackend) -> None:
    # A batch runs its lanes one after the other; the hold of an entity is taken with the
    # claim, but the lane's first event started unchecked. An instance frozen in the batch's
    # earlier handler past its lease, then thawed, ran the older position of an entity
    # whose newer one had succeeded under the next holder meanwhile (and made its effect).
    with world(make_backend, 0.0, 0.0) as w:
        w.new_call("fast", shared=False, emit=False, plan=["hang"])
        hung = last(w)
        w.new_order("e1", 1, plan=[], call=True)
        older = last(w)
        w.deliver(w.instances[0], [hung, older])  # the call's lane first: it hangs
        w.freeze(w.instances[0])
        w.advance(PAST_LEASE)  # its claims and its hold on e1 lapse
        w.new_order("e1", 5, plan=[])
        newer = last(w)
        w.deliver(w.instances[1], [newer])  # the next holder applies position 5
        assert status(w, newer) == "SUCCESS"
        w.instances[0].frozen = False
        w.release(w.hangs[0])  # the first instance goes on to e1's lane
        w.check()  # position 1 never starts after position 5 succeeded
        assert effects(w, f"order:{older.key}") == 0
        w.settle()
        assert status(w, older) == "SUCCESS"
        assert (w.store.get(older.key) or {}).get("stale")  # applied as stale, never run
        assert effects(w, f"order:{older.key}") == 0
