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
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

# C0 and C1 controls, DEL, zero-width and bidi controls, line/paragraph
# separators, the BOM, and lone surrogates (which cannot even be encoded).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")
MAX_CELL = 60
WIDTH = 100
"""How many columns a table takes unless told otherwise (``--wide``: no limit)."""
MIN_COLUMN = 6
SHORT = 24
"""Columns are cut to this first (a time as ``moment`` writes it fits), below it only then."""
"""A column is cut no narrower than this (its header is cut too)."""
ELLIPSIS = "…"


def safe(value: Any) -> str:
    """Return ``value`` as text in which every control or invisible character is escaped."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clip(text: str, width: int = MAX_CELL) -> str:
    """Return ``text`` cut to ``width`` terminal columns, with an ellipsis when cut."""
    if columns(text) <= width:
        return text
    if width <= 0:
        return ""
    if text.isascii():
        return text[:width - 1] + ELLIPSIS
    kept, used = [], 0
    for char in text:
        size = _columns_of(char)
        if used + size > width - 1:
            break
        kept.append(char)
        used += size
    return "".join(kept) + ELLIPSIS


def columns(text: str) -> int:
    """Return how many terminal columns ``text`` takes: wide characters two, combining none."""
    return len(text) if text.isascii() else sum(map(_columns_of, text))


def _columns_of(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *,
          width: int = MAX_CELL, whole: Sequence[str] = ("key",),
          total: int | None = WIDTH) -> str:
    """Return an aligned text table, every cell escaped, no line wider than ``total`` columns.

    Each cell is first cut to ``width`` columns, except in the columns named in
    ``whole`` (keys, which an operator copies). If the table is still wider than
    ``total``, the widest other columns are cut further, down to ``MIN_COLUMN``;
    if that is not enough, the ``whole`` columns move to a line of their own
    above each row (cut only when one is wider than ``total`` by itself; the
    commands' ``--json`` has every value in full), and the rest is indented
    under it. ``total=None`` (``--wide``) cuts nothing.
    """
    texts = [[safe("" if cell is None else cell) for cell in row] for row in rows]
    if total is None:
        return _grid(headers, texts, None)
    limits = [10**9 if header in whole else width for header in headers]
    cells = [[clip(cell, limit) for cell, limit in zip(row, limits, strict=True)]
             for row in texts]
    kept = [n for n, header in enumerate(headers) if header in whole]
    if not kept or _fits(headers, cells, kept, total):
        return _grid(headers, cells, total, kept)
    rest = [n for n in range(len(headers)) if n not in kept]
    inner = _grid([headers[n] for n in rest], [[row[n] for n in rest] for row in cells],
                  total - 2).splitlines()
    lines = ["  ".join(headers[n] for n in kept), *(f"  {line}" for line in inner[:2])]
    for row, line in zip(cells, inner[2:], strict=True):
        lines += [clip("  ".join(row[n] for n in kept).rstrip(), total), f"  {line}"]
    return "\n".join(line.rstrip() for line in lines)


def _fits(headers: Sequence[str], cells: Sequence[Sequence[str]], kept: Sequence[int],
          total: int) -> bool:
    """Whether the table fits ``total`` with the ``kept`` columns whole, the others cut.

    Cut as ``_shrink`` does, but no column ``SHORT`` or narrower is cut: keys move to
    a line of their own before times and statuses are cut for them.
    """
    sizes = _sizes(headers, cells)
    budget = total - 2 * (len(headers) - 1)
    _shrink(sizes, [n for n in range(len(headers)) if n not in kept], budget, short=False)
    return sum(sizes) <= budget


def _sizes(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[int]:
    return [max([columns(header), *(columns(row[n]) for row in cells)])
            for n, header in enumerate(headers)]


def _grid(headers: Sequence[str], cells: Sequence[Sequence[str]], total: int | None,
          kept: Sequence[int] = ()) -> str:
    """The aligned table of ``cells``, its widest columns cut to fit ``total``.

    The ``kept`` columns are cut last, when the others are at their minimum.
    """
    sizes = _sizes(headers, cells)
    if total is not None:
        budget = total - 2 * (len(headers) - 1)
        _shrink(sizes, [n for n in range(len(headers)) if n not in kept], budget)
        _shrink(sizes, kept, budget)
    heads = [clip(header, size) for header, size in zip(headers, sizes, strict=True)]
    lines = [_line(heads, sizes), _line(["-" * size for size in sizes], sizes)]
    lines += [_line([clip(cell, size) for cell, size in zip(row, sizes, strict=True)], sizes)
              for row in cells]
    if total is not None:  # columns at their minimum and still too many: cut the lines
        lines = [clip(line, total) for line in lines]
    return "\n".join(lines)


def _shrink(sizes: list[int], candidates: Iterable[int], budget: int, *,
            short: bool = True) -> None:
    """Narrow the widest of ``candidates`` one column at a time until ``sizes`` fit ``budget``.

    First none below ``SHORT``, then only the columns that were wider than it,
    then any (unless not ``short``): times, statuses and counts stay whole while
    long texts give way. None goes below ``MIN_COLUMN``.
    """
    every = list(candidates)
    long = [n for n in every if sizes[n] > SHORT]
    passes = [(SHORT, every), (MIN_COLUMN, long)] + [(MIN_COLUMN, every)] * short
    for floor, chosen in passes:
        excess = sum(sizes) - budget
        while excess > 0:
            wide = [n for n in chosen if sizes[n] > floor]
            if not wide:
                break
            widest = max(wide, key=lambda n: sizes[n])
            sizes[widest] -= 1
            excess -= 1


def _line(cells: Sequence[str], sizes: Sequence[int]) -> str:
    return "  ".join(cell + " " * (size - columns(cell))
                     for cell, size in zip(cells, sizes, strict=True)).rstrip()


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
