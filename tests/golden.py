"""Load the golden push payloads kept as JSON files in ``tests/payloads``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAYLOADS = Path(__file__).parent / "payloads"


def names() -> list[str]:
    """Return the golden payload file names, sorted."""
    return sorted(p.name for p in PAYLOADS.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    """Return ``{"headers": ..., "body": ...}`` of one golden payload."""
    document: dict[str, Any] = json.loads((PAYLOADS / name).read_text())
    return document


def body_bytes(name: str) -> bytes:
    """Return the payload's body exactly as it is sent."""
    return json.dumps(load(name)["body"]).encode()
