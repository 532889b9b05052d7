"""A write the store refuses for its content fails for good, on both stores, never 503 to the cap.

The handler's effect goes to the real MongoDB-compatible server (its own
collection), the event record to each store in turn: a document grown past the
server's size limit, or too large to send, can never be written, so the event
is stored FAILED for good with the reason (``content``) and acked.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from pymongo.database import Database
from pymongo.errors import AutoReconnect

from eventbus.model import content
from eventbus.model.context import Context
from eventbus.model.delivery import Delivery
from eventbus.model.event import Event
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.processor import Processor
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import EventStore
from eventbus.testing import FakeClock
from tests.closing import closed_after_test

MB = 1024 * 1024


def grow_past_the_limit(context: Context, target: Database) -> None:
    """Two pushes of 9 MB onto one document: the second can never be stored (over 16 MB)."""
    doc_id = context.key
    target.effects.update_one({"_id": doc_id}, {"$push": {"blobs": "x" * (9 * MB)}}, upsert=True)
    target.effects.update_one({"_id": doc_id}, {"$push": {"blobs": "y" * (9 * MB)}})


def too_large_to_send(context: Context, target: Database) -> None:
    target.effects.insert_one({"_id": context.key, "blob": "x" * (17 * MB)})


def message() -> Delivery:
    body = (b'{"event_type":"TEST","entity_metadata":{"partnerId":"p","entity_id":"e",'
            b'"entity_type":"T"},"entity_data":{"n":1}}')
    return Delivery(body, {"idempotency_key": uuid.uuid4().hex}, message_id=uuid.uuid4().hex)


@pytest.mark.parametrize("effect", [grow_past_the_limit, too_large_to_send])
def test_a_write_the_store_refuses_fails_for_good_with_the_reason(
        store: EventStore, mongo_db: Database, effect: object) -> None:
    routes = Router()
    routes.handler("TEST")(lambda context: effect(context, mongo_db))  # type: ignore[operator]
    run = closed_after_test(Processor(store, routes, Settings(max_attempts=50),
                                      FakeClock(datetime.now(UTC))))
    result = run.process(message())
    assert result.outcome is Outcome.REJECTED, result
    record = store.get(result.key) or {}
    assert (record["event_status"], record["retryable"]) == ("FAILED", False)
    assert record["error"]["classification"] == "content"
    assert record["attempts"] == 1


def test_a_connection_failure_is_not_a_content_refusal() -> None:
    assert not documents.refuses_content(AutoReconnect("store down"))
    assert not documents.refuses_content(TimeoutError())


HOSTILE_MESSAGES = {"surrogate": "\ud800 lone", "nul": "a\x00b",
                    "huge": "é\udfff" + "x" * 100_000}


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("text", HOSTILE_MESSAGES.values(), ids=HOSTILE_MESSAGES.keys())
def test_an_error_message_no_store_keeps_is_stored_escaped_and_keeps_its_classification(
        store: EventStore, text: str, ordered: bool) -> None:
    # A transient failure (here an ordered route's upcaster's) whose message holds a lone
    # surrogate or NUL is stored retryable with its message escaped and bounded; the
    # server refused the raw text, which turned it into a "content" failure for good.
    def upcast(event: Event) -> Event:
        raise ConnectionError(text)

    routes = Router()
    routes.handler("TEST", versions=("v2",), upcasters={"v1": upcast},
                   ordered_by="entity_data.n" if ordered else None)(lambda context: None)
    run = closed_after_test(Processor(store, routes, Settings(max_attempts=5),
                                      FakeClock(datetime.now(UTC))))
    result = run.process(message())
    assert result.outcome is Outcome.RETRY, result
    record = store.get(result.key) or {}
    assert (record["event_status"], record["retryable"]) == ("FAILED", True)
    assert (record["error"]["type"], record["error"]["classification"]) == \
        ("ConnectionError", "transient")
    stored = record["error"]["message"]
    assert stored == content.bounded_text(text, documents.MAX_ERROR_MESSAGE)  # escaped
    assert len(stored) <= documents.MAX_ERROR_MESSAGE and "\x00" not in stored
    stored.encode("utf-8")  # no lone surrogate left
