"""The one place where outcomes and request errors become HTTP statuses and bodies.

Pub/Sub acks any 2xx and redelivers, with backoff, anything else.

A body says what happened, never what went wrong inside: the outcome, the
key, the attempt, the error's type and classification, and the request id
to find the details in the logs. Exception messages of the store or of a
handler's calls (MongoDB topology and hosts, partner URLs) go to the logs
only; a 503 body carries none of them. Only an acked rejection may add
what is wrong with the input itself (the processor's brief ``Type: what``).
"""

from __future__ import annotations

from typing import Any

from eventbus.model.errors import RequestError
from eventbus.model.outcome import Outcome
from eventbus.processor import Result

STATUS: dict[Outcome, int] = {outcome: outcome.facts.status for outcome in Outcome}
"""Each outcome's HTTP status (``eventbus.model.outcome.FACTS``)."""
# A failure of our own code outside any handler: nack, so nothing is lost.
INTERNAL_ERROR_STATUS = 503


CLASSIFICATION: dict[str, str] = {outcome.value: outcome.facts.classification
                                  for outcome in Outcome if outcome.facts.classification}
"""How each failed outcome (by its value) is classified in the body; no entry: no error."""
_DEFAULT_TYPE = {"unavailable": "StoreUnavailable", "in_progress": "LeaseHeld",
                 "lease_lost": "LeaseLost"}
_MAX_MESSAGE = 300


def outcome_response(result: Result, request_id: str = "") -> tuple[dict[str, Any], int]:
    """Return the JSON body and status for a processed delivery (see the module docstring)."""
    status = STATUS[result.outcome]
    body: dict[str, Any] = {"outcome": result.outcome.value, "idempotency_key": result.key}
    if result.attempt:
        body["attempt"] = result.attempt
    if result.outcome.value in CLASSIFICATION:
        body.update(_error_fields(result, acked=status < 300))
    if request_id:
        body["requestId"] = request_id
    return body, status


def _error_fields(result: Result, *, acked: bool) -> dict[str, Any]:
    """Return ``error`` (a type name), ``classification`` and, if acked, ``message``."""
    head, _, detail = result.error.partition(":")
    head = head.strip()
    fields: dict[str, Any] = {
        "error": head if head.isidentifier() and len(head) <= 100
        else _DEFAULT_TYPE.get(result.outcome.value, "Error"),
        "classification": CLASSIFICATION[result.outcome.value]}
    if acked and detail.strip() and head.isidentifier():
        fields["message"] = detail.strip()[:_MAX_MESSAGE]
    return fields


def error_response(error: RequestError, request_id: str = "") -> tuple[dict[str, Any], int]:
    """Return the JSON body and status for a request that is not processed."""
    body = {"error": error.code, "message": str(error)[:_MAX_MESSAGE]}
    if request_id:
        body["requestId"] = request_id
    return body, error.status


def internal_error_response(request_id: str) -> tuple[dict[str, Any], int]:
    """Return the body for an unexpected failure: no traceback, a request id to grep for."""
    return {"error": "internal", "message": "unexpected error; Pub/Sub will retry",
            "requestId": request_id}, INTERNAL_ERROR_STATUS
