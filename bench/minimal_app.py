"""The reference row of ``bench/handler.py``: the thinnest Flask service doing the store's work.

Per push it reads ``idempotency_key`` from the wrapped body and runs the same
two round trips as the raw pymongo baseline (``raw_claim_and_complete``), on
its own collection with the same indexes; no validation, routing, logging or
error handling. Its rate is what any Flask + pymongo service can reach here,
so ``handler, telemetry off`` over this row is the framework's own cost.
"""

from __future__ import annotations

import json
import os

import flask

from bench.handler import mongo_client, raw_claim_and_complete
from eventbus.store.mongo import INDEXES

COLLECTION = "minimal_events"

app = flask.Flask("bench-minimal")
_events = mongo_client(os.environ["MONGODB_URI"])[os.environ["MONGODB_DB"]][COLLECTION]
_events.create_indexes(list(INDEXES))


@app.post("/")
def push() -> tuple[dict[str, str], int]:
    """Claim and complete the pushed event's key; answer like the service does."""
    key = json.loads(flask.request.get_data())["message"]["attributes"]["idempotency_key"]
    raw_claim_and_complete(_events, key)
    return {"outcome": "processed", "idempotency_key": key}, 200


@app.get("/health")
def health() -> dict[str, str]:
    """Answer the harness's readiness probe."""
    return {"status": "ok"}
