"""The partner app's CI step: ``eventbus verify --sample`` on the recorded sample.

Run as CI runs it: a fresh ``python -m eventbus`` from the project root, no
database, the app loaded by ``--app``. It passes on the app as it is, and
fails, naming the event and the child, on an app whose handler renamed a step
(``PARTNER_NOTIFY`` becomes ``PARTNER_ALERT``: a deploy after which a redrive
of an old order would notify the partner a second time under a new key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.verify.recording import ROOT, SAMPLE

RENAMED = '''"""The partner app after a deploy that renamed its notification step."""
from handlers import notifications

notifications.NOTIFY = "PARTNER_ALERT"  # what the deploy changed

from handlers import create_router  # noqa: E402
'''


def verify(*argv: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(p) for p in (path, ROOT / "src", ROOT) if p is not None])}
    env.pop("MONGODB_URI", None)  # no database: the sample is all it reads
    return subprocess.run([sys.executable, "-m", "eventbus", "verify", "--sample", str(SAMPLE),
                           *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_recorded_sample_verifies_on_the_unchanged_app() -> None:
    done = verify("--app", "handlers:create_router")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 different, 0 unverifiable, 0 unreadable" in done.stdout
    assert "Traceback" not in done.stderr


def test_a_renamed_step_fails_naming_the_event_and_the_child(tmp_path: Path) -> None:
    (tmp_path / "renamed_app.py").write_text(RENAMED)
    done = verify("--app", "renamed_app:create_router", "--json", path=tmp_path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    changed = [(verdict["key"], difference) for verdict in report["verdicts"]
               if verdict["state"] == "different" for difference in verdict["differences"]]
    assert changed, report
    for event, difference in changed:
        assert event.startswith("p:") and event.split(":")[3] in ("OR_MGMT", "SUB_MGMT",
                                                                  "PROM_MGMT")
        assert difference["child"] == f"{event}/0:PARTNER_NOTIFY"
        assert difference["now"]["key"] == f"{event}/0:PARTNER_ALERT"
    # The recorded PARTNER_NOTIFY children have no route any more: not verifiable.
    unrouted = [v for v in report["verdicts"] if v["event_type"] == "PARTNER_NOTIFY"]
    assert unrouted and all(v["state"] == "unverifiable" for v in unrouted)
    text = verify("--app", "renamed_app:create_router", path=tmp_path).stdout
    event, difference = changed[0]
    assert event in text and difference["child"] in text
