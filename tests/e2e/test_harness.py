"""The end-to-end fixtures themselves, against a throwaway Flask app (not main:app).

The app records each push body in a file, so the test sees what gunicorn got
from the emulator; ``PUSH_STATUS`` sets the status it answers.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.pubsub.resources import Admin
from tests.e2e.harness import (
    E2E_PROJECT,
    PushRoute,
    Receiver,
    ServiceProcess,
    group_processes,
    wait_until,
)

APP = textwrap.dedent(
    """
    import json, os
    from flask import Flask, request

    app = Flask(__name__)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/")
    def push():
        with open(os.environ["RECEIVED"], "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "body": request.get_json()}) + "\\n")
        return "", int(os.environ.get("PUSH_STATUS", "204"))
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "pushapp.py").write_text(APP)
    (tmp_path / "broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    return tmp_path


def received(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(values), timeout=2, interval=0) == 7


def test_wait_until_times_out_naming_the_last_value_or_error() -> None:
    with pytest.raises(
        AssertionError, match=r"timed out after 0.2s waiting for the answer; last value: 0"
    ):
        wait_until(lambda: 0, timeout=0.2, message="the answer")

    def refuse() -> bool:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(AssertionError, match=r"waiting for refuse; last error: Connection"):
        wait_until(refuse, timeout=0.2)


def test_service_serves_the_app_and_stop_leaves_no_process(
    service: Callable[..., ServiceProcess], app_dir: Path
) -> None:
    svc = service(app="pushapp:app", cwd=app_dir, env={"RECEIVED": str(app_dir / "got")}, workers=2)
    with urllib.request.urlopen(f"{svc.url}/health", timeout=5) as response:
        assert response.status == 200
    assert svc.log_path.parent == app_dir
    assert svc.process is not None
    assert len(group_processes(svc.process.pid)) == 3  # master + 2 workers
    assert svc.stop() == 0
    assert group_processes(svc.process.pid) == []


def test_service_that_cannot_start_fails_with_its_log_tail(
    service: Callable[..., ServiceProcess], app_dir: Path
) -> None:
    with pytest.raises(pytest.fail.Exception) as failure:
        service(app="broken:app", cwd=app_dir, startup_timeout=20)
    assert "did not answer GET" in str(failure.value)
    assert "broken on purpose" in str(failure.value)


def test_push_route_delivers_to_the_service(
    emulator: str,
    service: Callable[..., ServiceProcess],
    push_route: Callable[..., PushRoute],
    app_dir: Path,
) -> None:
    got = app_dir / "got"
    svc = service(app="pushapp:app", cwd=app_dir, env={"RECEIVED": str(got)})
    route = push_route(emulator, f"{svc.url}/")
    message_id = route.publish(b'{"hello": "world"}', event_type="OR_MGMT")
    (record,) = wait_until(lambda: received(got), timeout=15, message="a push at the service")
    body = record["body"]
    assert isinstance(body, dict)
    assert body["subscription"] == route.subscription_path
    assert body["message"]["messageId"] == message_id
    assert body["message"]["attributes"] == {"event_type": "OR_MGMT"}
    assert base64.b64decode(body["message"]["data"]) == b'{"hello": "world"}'
    assert route.topic_path.endswith(f"/topics/{route.topic}")
    assert route.service_env() == {
        "PUBSUB_EMULATOR_HOST": emulator,
        "GOOGLE_CLOUD_PROJECT": E2E_PROJECT,
        "PUBSUB_TOPIC": route.topic,
    }


def test_push_route_dead_letters_after_max_delivery_attempts(
    emulator: str, push_route: Callable[..., PushRoute]
) -> None:
    with Receiver(then=503) as receiver:
        route = push_route(
            emulator, receiver.url, min_backoff=0, max_backoff=1, max_delivery_attempts=5
        )
        route.publish(b"never accepted", partner="p1")
        (dead,) = wait_until(route.dead_letters, timeout=45, message="the dead letter")
    assert len(receiver.pushes) == 5
    assert dead.message.data == b"never accepted"
    assert dead.message.attributes["partner"] == "p1"
    assert dead.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert dead.message.attributes["CloudPubSubDeadLetterSourceSubscription"] == route.subscription
    gaps = [
        round(b.at - a.at, 1) for a, b in zip(receiver.pushes, receiver.pushes[1:], strict=False)
    ]
    print(f"delivery gaps with backoff 0s..1s: {gaps}")


def test_push_route_delete_removes_topic_and_subscriptions(emulator: str) -> None:
    with Admin(emulator, E2E_PROJECT) as admin:
        route = PushRoute.create(admin, "http://127.0.0.1:9/", max_delivery_attempts=5)
        names = {route.topic, route.dead_letter_topic}
        assert names <= set(admin.topics())
        route.delete()
        assert not names & set(admin.topics())
        subscriptions = {s.name for s in admin.subscriptions()}
        assert route.subscription_path not in subscriptions


def test_service_stop_kills_a_master_that_ignores_sigterm(
    service: Callable[..., ServiceProcess], app_dir: Path
) -> None:
    svc = service(app="pushapp:app", cwd=app_dir, env={"RECEIVED": str(app_dir / "got")}, workers=1)
    assert svc.process is not None
    os.kill(svc.process.pid, signal.SIGSTOP)  # a master that can no longer act on SIGTERM
    began = time.monotonic()
    svc.stop(grace=1)
    assert time.monotonic() - began < 10
    assert group_processes(svc.process.pid) == []
