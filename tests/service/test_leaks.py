"""503 bodies name the outcome, never internal details; the details go to the logs (issue 10).

A store error that names the MongoDB topology and a partner error that names
the partner URL used to be echoed in the answer. Now the body says the
outcome, the key, the attempt, the error's type and classification and the
request id; the log lines keep the full message.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventbus.correlation import logs
from eventbus.model.context import Context
from eventbus.model.errors import PermanentError, StoreUnavailable
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.processor import Result
from eventbus.store.memory import MemoryEventStore
from eventbus.web.http_status import STATUS, outcome_response
from handlers.partners import PartnerRejected, PartnerUnavailable
from tests.service.conftest import Harness, Make, event

MONGO_HOSTS = "mongo-0.db.internal.example:27017"
TOPOLOGY = (f"claim 'k': ServerSelectionTimeoutError: {MONGO_HOSTS}: [Errno 111] Connection "
            "refused, Timeout: 5.0s, Topology Description: <TopologyDescription id: 65f0, "
            f"topology_type: ReplicaSetNoPrimary, servers: [<ServerDescription ('{MONGO_HOSTS}')"
            " server_type: Unknown>]>")
PARTNER_URL = "http://partner-gw.internal.example:8443/partners/p1/events"


class TopologyDown(MemoryEventStore):
    """A store whose server cannot be reached, with pymongo's kind of message."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable(TOPOLOGY)


def capture(h: Harness) -> io.StringIO:
    """Send the service's log lines to a string (create_app configured them already)."""
    stream = io.StringIO()
    logs.configure("svc", stream=stream)
    return stream


def raising(exc: Exception) -> Router:
    router = Router()

    @router.handler("TEST")
    def handle(context: Context) -> None:
        raise exc

    return router


def test_store_unavailable_body_has_no_topology_but_the_log_has(make_harness: Make) -> None:
    h = make_harness(router=raising(AssertionError("not reached")), store=TopologyDown())
    stream = capture(h)
    data = base64.b64encode(json.dumps(event("TEST")).encode()).decode()
    response = h.client.post("/", json={"message": {"data": data, "messageId": "m-1"}},
                             headers={"X-Request-Id": "req-store-1"})
    text = response.get_data(as_text=True)
    assert response.status_code == 503 and response.json["outcome"] == "unavailable"
    assert response.json["classification"] == "store_unavailable"
    assert response.json["error"] == "StoreUnavailable"
    assert response.json["requestId"] == "req-store-1"
    for secret in ("internal.example", "27017", "Topology", "ServerSelection", "refused"):
        assert secret not in text
    assert MONGO_HOSTS in stream.getvalue() and "Topology Description" in stream.getvalue()


def test_partner_error_body_has_no_url_but_the_log_has(make_harness: Make) -> None:
    failure = PartnerUnavailable(f"partner call to {PARTNER_URL} failed: ConnectionError: "
                                 f"HTTPConnectionPool(host='partner-gw.internal.example')")
    h = make_harness(router=raising(failure))
    stream = capture(h)
    response = h.push(event(), "m-2")
    text = response.get_data(as_text=True)
    assert response.status_code == 503 and response.json["outcome"] == "retry"
    body = response.json
    assert (body["error"], body["classification"], body["attempt"]) == \
        ("PartnerUnavailable", "transient", 1)
    assert body["idempotency_key"] and body["requestId"] == response.headers["X-Request-Id"]
    assert "internal.example" not in text and "8443" not in text and "message" not in body
    logged = stream.getvalue()
    assert PARTNER_URL in logged and body["requestId"] in logged
    # The stored record keeps the full message for operators.
    stored = h.store.get(body["idempotency_key"])
    assert PARTNER_URL in stored["error"]["message"]


@pytest.mark.parametrize("failure", [
    PartnerRejected(f"partner answered 404 at {PARTNER_URL}"),
    PermanentError(f"cannot reach {MONGO_HOSTS}"),
])
def test_acked_failures_do_not_echo_internal_messages_either(make_harness: Make,
                                                             failure: Exception) -> None:
    h = make_harness(router=raising(failure))
    stream = capture(h)
    response = h.push(event(), "m-3")
    assert response.status_code == 200 and response.json["outcome"] == "rejected"
    assert response.json["error"] == type(failure).__name__
    assert response.json["classification"] == "permanent"
    assert "internal.example" not in response.get_data(as_text=True)
    assert "internal.example" in stream.getvalue()


def test_an_invalid_payload_still_says_what_is_wrong_with_it(make_harness: Make) -> None:
    h = make_harness(router=Router())
    response = h.push(b"not json", "m-4")
    assert response.status_code == 200 and response.json["outcome"] == "rejected"
    assert response.json["error"] and response.json["classification"] == "permanent"


@pytest.mark.parametrize("outcome", [o for o in Outcome if STATUS[o] >= 500])
@pytest.mark.parametrize("error", [
    TOPOLOGY, f"PartnerUnavailable: partner call to {PARTNER_URL} failed",
    f"StoreUnavailable: {TOPOLOGY}", "", "LeaseLost", f"{PARTNER_URL}: refused"])
def test_no_503_body_carries_an_error_message(outcome: Outcome, error: str) -> None:
    body, status = outcome_response(Result(outcome, key="k", attempt=3, error=error), "r-1")
    assert status == 503
    assert set(body) == {"outcome", "idempotency_key", "attempt", "error", "classification",
                         "requestId"}
    assert body["error"].isidentifier() and "internal" not in json.dumps(body)


@given(st.sampled_from([o for o in Outcome if STATUS[o] >= 500]),
       st.text() | st.sampled_from([TOPOLOGY, PARTNER_URL]),
       st.text(st.characters(codec="ascii"), max_size=20))
def test_a_503_body_is_never_more_than_an_identifier_of_the_error(
        outcome: Outcome, error: str, head: str) -> None:
    text = f"{head}: {error}" if head else error
    body, _ = outcome_response(Result(outcome, key="k", error=text))
    assert "message" not in body
    assert body["error"].isidentifier() and len(body["error"]) <= 100
    assert body["error"] in (text.partition(":")[0].strip(), "StoreUnavailable", "LeaseHeld",
                             "LeaseLost", "Error")


def test_processed_bodies_have_no_error() -> None:
    body, status = outcome_response(Result(Outcome.PROCESSED, key="k", attempt=1), "r")
    assert status == 200 and body == {"outcome": "processed", "idempotency_key": "k",
                                      "attempt": 1, "requestId": "r"}
