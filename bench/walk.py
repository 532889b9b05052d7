"""The walk of one push: how many library files and function calls a push goes through.

    .venv/bin/python bench/walk.py [--pushes 20]

A no-op handler behind ``create_app`` on the memory store, posted through Flask's
test client; after ``--pushes`` warm-up pushes, one more new event's push is
profiled (``cProfile``) and counted: the distinct files under ``src/eventbus`` it
ran code in, the calls made in them, and all calls (the standard library's and
Flask's too). Deterministic for a given commit, so two commits compare directly
(issue 41: the walk before and after the feature folders). Run from a checkout's
root; ``PYTHONPATH=<other checkout>/src`` walks another commit's library.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import pstats
import sys
from pathlib import Path

from eventbus import Router, Settings, create_app
from eventbus.store.memory import MemoryEventStore


def body(number: int) -> bytes:
    """The push body of a new event ``number`` (wrapped push, a v1 OR_MGMT event)."""
    event = {"event_type": "OR_MGMT", "event_version": "v1",
             "entity_metadata": {"partnerId": "p1", "entity_id": f"o-{number}",
                                 "entity_type": "Order"},
             "data": {"n": number}}
    data = base64.b64encode(json.dumps(event).encode()).decode()
    return json.dumps({"message": {"data": data, "messageId": f"m-{number}",
                                   "attributes": {}},
                       "subscription": "projects/p/subscriptions/s"}).encode()


def main() -> None:
    """Warm up, profile one push, print its walk as a small table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20, help="warm-up pushes first")
    args = parser.parse_args()
    routes = Router()

    @routes.handler("OR_MGMT", versions=("v1",))
    def noop(context: object) -> None:
        return None

    app = create_app(routes, Settings(relay_inline=False, auth_enabled=False),
                     MemoryEventStore())
    client = app.test_client()
    for number in range(args.pushes):
        assert client.post("/", data=body(number), content_type="application/json").status_code \
            == 200
    profile = cProfile.Profile()
    profile.enable()
    answer = client.post("/", data=body(10**6), content_type="application/json")
    profile.disable()
    assert answer.status_code == 200, answer.get_data(as_text=True)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    library = str(Path(sys.modules["eventbus"].__file__ or "").parent)
    files: set[str] = set()
    ours = total = 0
    for (filename, _, _), (_, calls, *_rest) in stats.items():
        total += calls
        if filename.startswith(library):
            files.add(filename[len(library) + 1:])
            ours += calls
    print(f"library: {library}")
    print(f"| library files | library calls | all calls |\n| --- | --- | --- |\n"
          f"| {len(files)} | {ours} | {total} |")


if __name__ == "__main__":
    main()
