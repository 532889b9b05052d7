"""Edit and retry's checks (``eventbus.ops.correct``) without a server."""

from __future__ import annotations

import pytest

from eventbus.model.errors import InvalidEvent
from eventbus.model.keys import REPLAY_OF
from eventbus.model.router import Router
from eventbus.ops import correct
from eventbus.processor import Intake
from eventbus.store.memory import MemoryEventStore

ENTITY = {"partnerId": "p-1", "entity_id": "o-1", "entity_type": "Order"}
REFUSED = {"idempotency_key": "invalid:abc", "event_status": "FAILED", "retryable": False,
           "rejected": True, "attempts": 0, "entity_metadata": {"partnerId": ""}}


def locate_with(routes: Router) -> Intake:
    return Intake(MemoryEventStore(), routes)


def test_a_correction_never_publishes_an_internal_step() -> None:
    routes = Router()
    routes.handler("STEP", internal=True)(lambda context: None)
    with pytest.raises(InvalidEvent, match="internal"):
        correct.correction(REFUSED, {"event_type": "STEP", "entity_metadata": ENTITY},
                           locate_with(routes).locate)


def test_a_correction_carries_the_link_and_its_audit_names_the_payload() -> None:
    routes = Router()
    routes.handler("OR_MGMT")(lambda context: None)
    fix = correct.correction(REFUSED, {"event_type": "OR_MGMT", "entity_metadata": ENTITY,
                                       "entity_data": {"n": 1}}, locate_with(routes).locate)
    assert fix.key == "invalid:abc" and fix.attributes[REPLAY_OF] == "invalid:abc"
    assert "idempotency_key" not in fix.attributes
    assert fix.audit["corrected"] is True and len(fix.audit["payload_fingerprint"]) == 64


@pytest.mark.parametrize("record", [
    {**REFUSED, "event_status": "SUCCESS"}, {**REFUSED, "event_status": "PROCESSING"},
    {**REFUSED, "attempts": 1, "rejected": False, "idempotency_key": "p:p-1:k"}])
def test_a_record_that_ran_is_not_correctable(record: dict[str, object]) -> None:
    with pytest.raises(correct.NotCorrectable):
        correct.check_correctable(record)
