"""The simulation's summary: runs, scheduling points and faults reached, at the session's end.

Each chunk of ``test_simulation`` writes ``var/sim/chunk-<first>.json``; the
terminal summary (``-v``, or always when ``SIM_SUMMARY=1``) adds up the files
this session wrote and writes the total to ``var/sim/summary.json``.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

OUT = Path(__file__).resolve().parents[2] / "var" / "sim"
STARTED = time.time()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Add up the chunks written in this session; print them with -v."""
    files = [path for path in OUT.glob("chunk-*.json") if path.stat().st_mtime >= STARTED]
    if not files:
        return
    runs = 0
    points: collections.Counter[str] = collections.Counter()
    decisions: collections.Counter[str] = collections.Counter()
    failures: dict[str, str] = {}
    for path in files:
        data = json.loads(path.read_text())
        runs += data["runs"]
        points.update(data["points"])
        decisions.update(data["decisions"])
        failures.update(data["failures"])
    total = {"runs": runs, "points": dict(points), "decisions": dict(decisions),
             "failures": failures, "seconds": round(time.time() - STARTED, 1)}
    (OUT / "summary.json").write_text(json.dumps(total, indent=2, sort_keys=True))
    if config.getoption("verbose") > 0 or os.environ.get("SIM_SUMMARY") == "1":
        write = terminalreporter.write_line
        write(f"simulation: {runs} runs, {sum(points.values())} scheduling points")
        write("  points:    " + ", ".join(f"{k} {v}" for k, v in points.most_common()))
        write("  decisions: " + ", ".join(f"{k} {v}" for k, v in decisions.most_common()))
        if failures:
            write("  failing seeds: " + ", ".join(f"{s} ({f})" for s, f in failures.items()))
