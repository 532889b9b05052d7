"""Printing stored values safely: escaped text, aligned tables, JSON.

Payloads, keys and error messages are written by outsiders. A terminal
escape code, a newline, a bidirectional override or a lone surrogate in a
stored value must never reach the operator's terminal raw, so every stored
value goes through ``safe`` before it is printed (``table`` does it for
each cell), and ``--json`` output is pure ASCII (``to_json``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

# C0 and C1 controls, DEL, zero-width and bidi controls, line/paragraph
# separators, the BOM, and lone surrogates (which cannot even be encoded).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")
MAX_CELL = 60
ELLIPSIS = "…"


def safe(value: Any) -> str:
    """Return ``value`` as text in which every control or invisible character is escaped."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clip(text: str, width: int = MAX_CELL) -> str:
    """Return ``text`` cut to ``width`` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + ELLIPSIS


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *,
          width: int = MAX_CELL, whole: Sequence[str] = ("key",)) -> str:
    """Return an aligned text table; every cell is escaped and clipped to ``width``.

    Columns named in ``whole`` (keys, which an operator copies) are never clipped.
    """
    limits = [len(header) + 10**6 if header in whole else width for header in headers]
    cells = [[clip(safe("" if cell is None else cell), limit)
              for cell, limit in zip(row, limits, strict=True)] for row in rows]
    sizes = [max([len(header), *(len(row[n]) for row in cells)])
             for n, header in enumerate(headers)]
    lines = [_line(headers, sizes), _line(["-" * size for size in sizes], sizes)]
    lines += [_line(row, sizes) for row in cells]
    return "\n".join(lines)


def _line(cells: Sequence[str], sizes: Sequence[int]) -> str:
    return "  ".join(cell.ljust(size) for cell, size in zip(cells, sizes, strict=True)).rstrip()


def to_json(value: Any) -> str:
    """Return ``value`` as indented, ASCII-only JSON (dates as ISO 8601)."""
    return json.dumps(value, indent=2, ensure_ascii=True, default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)  # ObjectId, Decimal128 and the like


def moment(epoch_ms: Any) -> str:
    """Return a stored epoch-ms string (seed 002's times) as UTC ISO 8601, or it escaped."""
    stamp = from_epoch_ms(epoch_ms)
    if stamp is None:
        return safe(epoch_ms) if epoch_ms is not None else ""
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def from_epoch_ms(epoch_ms: Any) -> dt.datetime | None:
    """Return the UTC time of an epoch-ms string or number; None when it is neither."""
    if isinstance(epoch_ms, str) and epoch_ms.isascii() and epoch_ms.isdigit():
        epoch_ms = int(epoch_ms)
    if not isinstance(epoch_ms, int) or isinstance(epoch_ms, bool):
        return None
    try:
        return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def duration(milliseconds: float | None) -> str:
    """Return a delay as ``850ms``, ``12.3s``, ``4m05s`` or ``2h03m``; empty for None."""
    if milliseconds is None:
        return ""
    if milliseconds < 1000:
        return f"{milliseconds:.0f}ms"
    seconds = milliseconds / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
