"""Record the partner app's verify sample: run the demo events, then ``--record-sample``.

The checked-in sample (``handlers/samples/verify_sample.jsonl``) is what this
writes: the demo events of ``handlers/samples/partner_events.json`` run
through the partner app on LocalBus (mongomock, a local partner stub that
answers 200), then ``eventbus verify --record-sample`` on that store, exactly
as an operator records one from production. Regenerate it after a change
that is *meant* to change children (and say so in the commit):

    python -m tests.verify.recording handlers/samples/verify_sample.jsonl
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import mongomock
import pytest

from eventbus.ops import cli
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import LocalBus
from handlers import create_router
from handlers.settings import AppSettings, PartnerSettings
from tests.partner_server import PartnerServer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "handlers" / "samples" / "partner_events.json"
SAMPLE = ROOT / "handlers" / "samples" / "verify_sample.jsonl"


def run_demo(partner_template: str) -> LocalBus:
    """The demo events run through the partner app, cascades and all, on LocalBus (closed:
    its store is what is read)."""
    router = create_router(AppSettings(partners=PartnerSettings(url=partner_template)))
    with LocalBus(router, database=mongomock.MongoClient(tz_aware=True)["demo"]) as bus:
        for spec in json.loads(DEMO.read_text()):
            if "raw" in spec:
                continue  # an invalid payload: stored FAILED, nothing to verify
            bus.publish(spec["event_type"], spec.get("data", {}), entity=spec["entity"],
                        version=spec.get("event_version", "v1"),
                        idempotency_key=spec.get("idempotency_key"),
                        ordering_key=spec.get("ordering_key"))
            bus.clock.advance(1)
    return bus


def cli_run(store: Any, *argv: str) -> tuple[int, str, str]:
    """``eventbus ARGV`` in this process, on ``store``; a publisher that must not be asked."""
    out, err = io.StringIO(), io.StringIO()

    def no_publisher(settings: Any, timeout: float = 30.0) -> Any:
        raise AssertionError("verify asked for a publisher")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "open_store", lambda settings: store)
        patch.setattr(cli, "publisher", no_publisher)
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def record(target: Path) -> tuple[int, str]:
    """Write the sample to ``target``; return the recording's exit code and its report."""
    with PartnerServer() as partner:
        bus = run_demo(partner.template)
        store: MemoryEventStore = bus.store  # type: ignore[assignment]
        code, out, err = cli_run(store, "verify", "--record-sample", "1000",
                                 "--app", "handlers:create_router")
    target.write_text(out)
    return code, err


if __name__ == "__main__":
    status, report = record(Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE)
    print(report, file=sys.stderr)
    sys.exit(status)
