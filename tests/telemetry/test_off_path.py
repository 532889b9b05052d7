"""With telemetry off, one push message enters no module of ``eventbus.telemetry``: telemetry is
middleware around the processor's stages, and with none the stages call nothing of it."""

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
from tests.closing import app_closed_after_test

TELEMETRY = str(Path(__file__).resolve().parents[2] / "src" / "eventbus" / "telemetry")
ENTITY = {"partnerId": "p1", "entity_id": "e-1", "entity_type": "Order"}


def push_body(event_type: str, number: int) -> dict[str, Any]:
    data = json.dumps(build_event(event_type, {"n": number}, entity=ENTITY).to_document())
    return {"message": {"data": base64.b64encode(data.encode()).decode(),
                        "messageId": f"m-{number}",
                        "attributes": {"event_type": event_type, "event_version": "v1"}},
            "subscription": "projects/p/subscriptions/s"}


def test_a_push_with_telemetry_off_enters_no_telemetry_module() -> None:
    routes = Router()
    routes.handler("PARENT")(lambda context: context.emit("CHILD", {}))
    routes.handler("CHILD", internal=True)(lambda context: None)
    app = app_closed_after_test(create_app(routes, Settings(), store=MemoryEventStore()))
    client = app.test_client()
    client.post("/", json=push_body("PARENT", 1))  # warm up: imports, indexes
    calls: list[str] = []
    entered: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            entered.append(frame.f_code.co_filename)
            if frame.f_code.co_filename.startswith(TELEMETRY):
                calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        answer = client.post("/", json=push_body("PARENT", 2))
    finally:
        sys.setprofile(None)
    assert answer.status_code == 200
    assert any("processor" in name for name in entered), "the profile sees the push"
    assert calls == []
