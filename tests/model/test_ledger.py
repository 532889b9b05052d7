"""The reference model's own checks: each fires on what it forbids, and not on what is allowed.

The model and the crash-point test are only as good as the ledger's checks;
these tests feed it the facts of one broken (or one legitimate) history by
hand, so every check is shown to be able to fail, including those no fault
of today's code reaches (a stored position moving back, a handler run past
its cap, an unjustified breaker refusal).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eventbus.model.outcome import Outcome
from tests.model.ledger import (
    DuplicateEffect,
    EntityOverlap,
    HandlerRun,
    Invocation,
    LeaseTaken,
    Ledger,
    Lost,
    Miscounted,
    OrderBroken,
    PartnerClock,
)
from tests.model.world import BREAKER_SECONDS, RATE_LIMIT, RATE_WINDOW, SETTINGS

T = datetime(2026, 1, 1, 12, 0, 1, tzinfo=UTC)
ENTITY = "entity:e1"


def ledger() -> Ledger:
    return Ledger(SETTINGS, rate_window=RATE_WINDOW, rate_limit=RATE_LIMIT,
                  breaker_window=BREAKER_SECONDS, rated={"slow"})


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def no_records(keys: list[str]) -> list[dict[str, object]]:
    return []


def test_a_second_effect_while_the_first_is_on_the_wire_is_a_duplicate() -> None:
    book = ledger()
    book.invoked(Invocation("g", "fast", 0, T))
    book.invoked(Invocation("g", "fast", 1, T))
    with pytest.raises(DuplicateEffect):
        book.raise_first()


def test_an_effect_after_a_failed_one_is_allowed_and_after_a_death_excused() -> None:
    book = ledger()
    failed = Invocation("g", "fast", 0, T)
    book.invoked(failed)
    book.effect_ended(failed, "raised", T, transient=True)
    book.invoked(Invocation("g", "fast", 1, T))  # a retry after a failure: allowed
    book.died(1, T)  # died before its success was stored: the unfenceable case
    book.invoked(Invocation("g", "fast", 2, at(30)))
    book.raise_first()


def test_a_claim_of_a_key_a_healthy_instance_holds_is_taken() -> None:
    book = ledger()
    book.claimed("k", "owner-a", 0, 1, healthy=True)
    book.claimed("k", "owner-b", 1, 2, healthy=True)
    with pytest.raises(LeaseTaken):
        book.raise_first()


def test_a_frozen_holders_claim_may_lapse_and_a_finished_one_is_gone() -> None:
    book = ledger()
    book.claimed("k", "owner-a", 0, 1, healthy=True)
    book.frozen(0)
    book.claimed("k", "owner-b", 1, 2, healthy=True)
    book.let_go("k", "owner-b")
    book.claimed("k", "owner-c", 2, 3, healthy=True)
    book.raise_first()


def test_a_sweeper_touching_a_running_event_takes_its_lease() -> None:
    book = ledger()
    book.claimed("k", "owner-a", 0, 1, healthy=True)
    book.touched("k", 1, "gave up")
    with pytest.raises(LeaseTaken):
        book.raise_first()


def test_two_handlers_of_one_entity_overlap() -> None:
    book = ledger()
    book.run_started(HandlerRun("a", 0, ENTITY, 1), no_records)
    book.run_started(HandlerRun("b", 1, ENTITY, 2), no_records)
    with pytest.raises(EntityOverlap):
        book.raise_first()


def test_a_handler_below_a_success_of_its_entity_breaks_the_order() -> None:
    book = ledger()
    book.ordered.update({"new": (ENTITY, 5), "old": (ENTITY, 3)})
    succeeded = [{"idempotency_key": "new", "event_status": "SUCCESS"}]
    book.run_started(HandlerRun("old", 0, ENTITY, 3), lambda keys: succeeded)
    with pytest.raises(OrderBroken):
        book.raise_first()


def test_a_stale_success_does_not_count_as_applied() -> None:
    book = ledger()
    book.ordered.update({"new": (ENTITY, 5), "old": (ENTITY, 3)})
    stale = [{"idempotency_key": "new", "event_status": "SUCCESS", "stale": {"position": 5}}]
    book.run_started(HandlerRun("old", 0, ENTITY, 3), lambda keys: stale)
    book.raise_first()


def test_an_older_success_after_a_newer_one_breaks_the_order() -> None:
    book = ledger()
    book.ordered.update({"new": (ENTITY, 5), "old": (ENTITY, 3)})
    book.observe({"new": {"event_status": "SUCCESS"}}, {})
    book.observe({"new": {"event_status": "SUCCESS"}, "old": {"event_status": "SUCCESS"}}, {})
    with pytest.raises(OrderBroken):
        book.raise_first()


def test_a_stored_position_moving_back_breaks_the_order() -> None:
    book = ledger()
    book.observe({}, {ENTITY: {"position": 5}})
    book.observe({}, {ENTITY: {"position": 3}})
    with pytest.raises(OrderBroken):
        book.raise_first()


def test_an_acked_message_without_a_record_is_lost() -> None:
    book = ledger()
    book.answered("k", Outcome.PROCESSED, claimed=True)
    book.observe({}, {})
    with pytest.raises(Lost):
        book.raise_first()


def test_more_runs_than_max_attempts_are_miscounted_and_parked_runs_are_not_runs() -> None:
    book = ledger()
    for _ in range(SETTINGS.max_attempts * 2):
        book.run_ended(HandlerRun("k", 0, parked=True))
    book.raise_first()
    for _ in range(SETTINGS.max_attempts + 1):
        book.run_ended(HandlerRun("k", 0))
    with pytest.raises(Miscounted):
        book.raise_first()


def test_an_attempt_cap_reached_by_parks_is_miscounted() -> None:
    book = ledger()
    for _ in range(SETTINGS.max_attempts):
        book.claimed("k", "o", 0, 1, healthy=True)
        book.answered("k", Outcome.PARKED, claimed=True)
    book.claimed("k", "o", 0, 1, healthy=True)
    capped = {"event_status": "FAILED", "error": {"type": "AttemptCapReached"}}
    book.observe({"k": capped}, {})
    with pytest.raises(Miscounted):
        book.raise_first()


def test_a_redrive_cap_reached_by_parked_redrives_is_miscounted() -> None:
    book = ledger()
    for _ in range(SETTINGS.redrive_max):
        book.redriven("k", "FAILED", parked=True)
    book.raise_first()
    book.observe({"k": {"event_status": "FAILED",
                        "error": {"classification": "redrive_cap"}}}, {})
    with pytest.raises(Miscounted):
        book.raise_first()


def test_calls_past_the_rate_on_one_clock_break_the_partners_window() -> None:
    book = ledger()
    book.invoked(Invocation("g1", "slow", 0, T))
    book.invoked(Invocation("g2", "slow", 1, at(RATE_WINDOW - 1)))  # across a boundary: ok
    book.raise_first()
    book.invoked(Invocation("g3", "slow", 1, at(RATE_WINDOW - 1)))
    with pytest.raises(PartnerClock):
        book.raise_first()


def test_a_refusal_without_a_recent_cause_breaks_the_partners_window() -> None:
    book = ledger()
    book.invoked(Invocation("g1", "slow", 0, T))
    book.refused("slow", "rate", at(1))  # one call in the window: refused rightly
    book.refused("fast", "breaker", at(2))  # no failure, no probe: refused on no clock
    with pytest.raises(PartnerClock, match="breaker"):
        book.raise_first()
