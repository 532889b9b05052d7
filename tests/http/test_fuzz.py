"""Hypothesis fuzzing of the push endpoint: never a 500, never a lost message."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.http.conftest import Harness, event

Make = Callable[..., Harness]


@pytest.fixture()
def harness(make_harness: Make) -> Harness:
    """One app and store for all examples of a test (hypothesis reuses function fixtures)."""
    return make_harness()
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                          max_leaves=12)
fields = st.sampled_from(["event_type", "event_version", "event_direction", "entity_metadata",
                          "entity_data", "partnerId"])
mutated_event = st.builds(
    lambda base, changes, drop: {k: v for k, v in {**base, **changes}.items() if k not in drop},
    st.builds(lambda t: event(t), st.sampled_from(["OR_MGMT", "SUB_MGMT", "PROM_MGMT", "X"])),
    st.dictionaries(fields, json_value, max_size=2), st.sets(fields, max_size=2))
payload = (st.binary(max_size=300) | json_value.map(lambda v: json.dumps(v).encode())
           | mutated_event.map(lambda v: json.dumps(v).encode()))


IDS = itertools.count()


def envelope(data: bytes, message_id: str, attributes: dict[str, str]) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                        "attributes": attributes}, "subscription": "projects/p/subscriptions/s"}


@FUZZ
@given(data=payload, attributes=st.dictionaries(
    st.sampled_from(["event_type", "event_version", "idempotency_key", "x"]),
    st.text(max_size=20), max_size=3))
def test_real_deliveries_are_acked_and_stored_or_retried(harness: Harness, data: bytes,
                                                         attributes: dict[str, str]) -> None:
    h = harness
    response = h.client.post("/", json=envelope(data, f"fuzz-{next(IDS)}", attributes))
    assert response.status_code in (200, 503), response.get_data(as_text=True)
    body = response.json
    assert body["outcome"] in {"processed", "duplicate", "rejected", "retry", "in_progress"}
    stored = h.store.get(body["idempotency_key"])
    assert stored is not None, "an acked or retried delivery must leave a record"
    if body["outcome"] == "rejected":
        assert stored["event_status"] == "FAILED" and stored["retryable"] is False


@FUZZ
@given(body=st.binary(max_size=400) | json_value.map(lambda v: json.dumps(v).encode()),
       headers=st.dictionaries(st.sampled_from(["ce-type", "x-goog-pubsub-message-id",
                                                "Content-Type", "Authorization"]),
                               st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                       max_size=30), max_size=3))
def test_any_request_gets_a_clear_answer(harness: Harness, body: bytes,
                                         headers: dict[str, str]) -> None:
    h = harness
    response = h.client.post("/", data=body, headers=headers)
    assert response.status_code in (200, 400, 503), response.get_data(as_text=True)
    assert response.is_json and "Traceback" not in response.get_data(as_text=True)
    if response.status_code == 400:
        assert response.json["error"] and response.json["message"]
    else:
        assert h.store.get(response.json["idempotency_key"]) is not None
