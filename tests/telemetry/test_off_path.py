"""With telemetry off, one push message runs nothing of ``eventbus.telemetry`` beyond one no-op
call per step: every call into the package comes from outside it and calls nothing further."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from eventbus import Router, create_app
from eventbus.pubsub.message import build_event
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore

TELEMETRY = str(Path(__file__).resolve().parents[2] / "src" / "eventbus" / "telemetry")
STEPS = {"message", "claiming", "claimed", "handler", "span", "emitting", "extract", "done",
         "publishing"}
ENTITY = {"partnerId": "p1", "entity_id": "e-1", "entity_type": "Order"}


def push_body(event_type: str, number: int) -> dict[str, Any]:
    data = json.dumps(build_event(event_type, {"n": number}, entity=ENTITY).to_document())
    return {"message": {"data": base64.b64encode(data.encode()).decode(),
                        "messageId": f"m-{number}",
                        "attributes": {"event_type": event_type, "event_version": "v1"}},
            "subscription": "projects/p/subscriptions/s"}


def test_a_push_with_telemetry_off_makes_only_no_op_calls_into_telemetry() -> None:
    routes = Router()
    routes.handler("PARENT")(lambda context: context.emit("CHILD", {}))
    routes.handler("CHILD", internal=True)(lambda context: None)
    app = create_app(routes, Settings(), store=MemoryEventStore())
    client = app.test_client()
    client.post("/", json=push_body("PARENT", 1))  # warm up: imports, indexes
    calls: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(TELEMETRY):
            caller = frame.f_back
            inside = caller is not None and caller.f_code.co_filename.startswith(TELEMETRY)
            calls.append((frame.f_code.co_name, "nested" if inside else "direct"))

    sys.setprofile(profile)
    try:
        answer = client.post("/", json=push_body("PARENT", 2))
    finally:
        sys.setprofile(None)
    assert answer.status_code == 200
    assert calls, "the processor calls the telemetry hooks"
    assert {name for name, _ in calls} <= STEPS
    assert {where for _, where in calls} == {"direct"}
    assert len(calls) <= 2 * len(STEPS)  # the parent and its relayed child: one call per step
