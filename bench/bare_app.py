"""The bare Flask baseline of ``bench/handler.py``: answers every push with 204, nothing else.

Served by the same gunicorn command and ``gunicorn.conf.py`` as ``main:app``.
"""

from __future__ import annotations

import flask

app = flask.Flask("bench-bare")


@app.post("/")
def push() -> tuple[str, int]:
    """Ack the push without reading it."""
    return "", 204


@app.get("/health")
def health() -> dict[str, str]:
    """Answer the harness's readiness probe."""
    return {"status": "ok"}
