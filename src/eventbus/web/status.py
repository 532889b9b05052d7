"""The one place where outcomes and request errors become HTTP statuses.

Pub/Sub acks any 2xx and redelivers, with backoff, anything else.
"""

from __future__ import annotations

from typing import Any

from eventbus.model.errors import RequestError
from eventbus.model.outcome import Outcome
from eventbus.processor import Result

STATUS: dict[Outcome, int] = {
    Outcome.PROCESSED: 200,
    Outcome.DUPLICATE: 200,
    Outcome.REJECTED: 200,
    Outcome.RETRY: 503,
    Outcome.IN_PROGRESS: 503,
    Outcome.UNAVAILABLE: 503,
}
# A failure of our own code outside any handler: nack, so nothing is lost.
INTERNAL_ERROR_STATUS = 503


def outcome_response(result: Result) -> tuple[dict[str, Any], int]:
    """Return the JSON body and status for a processed delivery."""
    body: dict[str, Any] = {"outcome": result.outcome.value, "idempotency_key": result.key}
    if result.attempt:
        body["attempt"] = result.attempt
    if result.error:
        body["error"] = result.error
    return body, STATUS[result.outcome]


def error_response(error: RequestError) -> tuple[dict[str, Any], int]:
    """Return the JSON body and status for a request that is not processed."""
    return {"error": error.code, "message": str(error)}, error.status


def internal_error_response(request_id: str) -> tuple[dict[str, Any], int]:
    """Return the body for an unexpected failure: no traceback, a request id to grep for."""
    return {"error": "internal", "message": "unexpected error; Pub/Sub will retry",
            "requestId": request_id}, INTERNAL_ERROR_STATUS
