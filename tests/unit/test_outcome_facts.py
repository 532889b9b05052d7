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
                     Outcome.PARKED, Outcome.DEFERRED, Outcome.STALE}
    assert all(200 <= FACTS[o].status < 300 for o in acked)
    assert all(FACTS[o].status == 503 for o in set(Outcome) - acked)
    # Final only where acked; a parked or deferred event is acked and still runs again
    # (the store's redrive, at the time it was given).
    final = {outcome for outcome in Outcome if FACTS[outcome].final}
    assert final == acked - {Outcome.PARKED, Outcome.DEFERRED}
    assert not any(FACTS[o].again for o in final)


def test_the_push_answer_the_body_and_the_rebuild_read_the_table() -> None:
    assert {outcome: FACTS[outcome].status for outcome in Outcome} == http_status.STATUS
    assert http_status.CLASSIFICATION["rejected"] == "permanent"
    assert "processed" not in http_status.CLASSIFICATION
    assert set(AGAIN) == {Outcome.IN_PROGRESS, Outcome.UNAVAILABLE, Outcome.LEASE_LOST}
    # A nack is never logged below WARNING; a stored failure for good is an ERROR.
    assert all(FACTS[o].level >= logging.WARNING for o in Outcome if not o.acked)
    assert FACTS[Outcome.REJECTED].level == logging.ERROR


def test_telemetry_reads_the_table_for_failed_attempts_and_settled_events() -> None:
    from eventbus.telemetry import stages

    failed = {outcome for outcome in Outcome if FACTS[outcome].failed}
    assert failed == {Outcome.RETRY, Outcome.REJECTED, Outcome.UNAVAILABLE, Outcome.LEASE_LOST}
    settles = {outcome for outcome in Outcome if FACTS[outcome].settles}
    assert settles == {Outcome.PROCESSED, Outcome.REJECTED, Outcome.STALE}
    assert settles <= {outcome for outcome in Outcome if FACTS[outcome].final}
    # No list of outcome names of its own is left in telemetry.
    source = stages.__loader__.get_source(stages.__name__) or ""  # type: ignore[union-attr]
    assert '"retry"' not in source and '"rejected"' not in source


def test_every_fact_is_set_on_every_row() -> None:
    import dataclasses

    names = {field.name for field in dataclasses.fields(FACTS[Outcome.PROCESSED])}
    assert names == {"status", "level", "classification", "final", "again", "failed", "settles"}
    for outcome in Outcome:
        facts = FACTS[outcome]
        assert isinstance(facts.status, int) and isinstance(facts.level, int)
        assert all(isinstance(getattr(facts, name), bool)
                   for name in ("final", "again", "failed", "settles"))
        assert facts.classification is None or isinstance(facts.classification, str)
