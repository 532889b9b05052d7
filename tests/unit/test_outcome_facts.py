"""Each outcome's facts live in one table (``eventbus.model.outcome.FACTS``), read everywhere."""

from __future__ import annotations

import logging

from eventbus.model.outcome import FACTS, Outcome
from eventbus.rebuild.runner import AGAIN
from eventbus.web import http_status


def test_every_outcome_has_one_row_and_acks_exactly_when_its_status_is_2xx() -> None:
    assert set(FACTS) == set(Outcome)
    acked = {outcome for outcome in Outcome if outcome.acked}
    assert acked == {Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.REJECTED, Outcome.CONFLICT,
                     Outcome.PARKED, Outcome.STALE}
    assert all(200 <= FACTS[o].status < 300 for o in acked)
    assert all(FACTS[o].status == 503 for o in set(Outcome) - acked)
    # Final only where acked; a parked event is acked and still runs again (redrive).
    final = {outcome for outcome in Outcome if FACTS[outcome].final}
    assert final == acked - {Outcome.PARKED}
    assert not any(FACTS[o].again for o in final)


def test_the_push_answer_the_body_and_the_rebuild_read_the_table() -> None:
    assert {outcome: FACTS[outcome].status for outcome in Outcome} == http_status.STATUS
    assert http_status.CLASSIFICATION["rejected"] == "permanent"
    assert "processed" not in http_status.CLASSIFICATION
    assert set(AGAIN) == {Outcome.IN_PROGRESS, Outcome.UNAVAILABLE, Outcome.LEASE_LOST}
    # A nack is never logged below WARNING; a stored failure for good is an ERROR.
    assert all(FACTS[o].level >= logging.WARNING for o in Outcome if not o.acked)
    assert FACTS[Outcome.REJECTED].level == logging.ERROR
