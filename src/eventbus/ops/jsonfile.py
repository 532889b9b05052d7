"""Reading an operator's JSON file: every way it can be unreadable is one line, never a traceback.

``eventbus publish`` and ``eventbus replay --data`` read events an operator
wrote. ``json.loads`` raises ``ValueError`` for bad text, ``UnicodeDecodeError``
for bytes that are not UTF-8, and ``RecursionError`` for deep nesting; JSON
that parses but nests deeper than an event may (``content.MAX_DEPTH``) could
never be stored. Each becomes ``Unreadable`` with one line saying which.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eventbus.model.content import MAX_DEPTH


class Unreadable(Exception):
    """Raised when an operator's JSON cannot be used; the message is one line."""


def read_text(source: str) -> str:
    """The text of ``source`` (a path, or ``-`` for stdin), strictly UTF-8."""
    import sys

    try:
        return sys.stdin.read() if source == "-" else Path(source).read_bytes().decode("utf-8")
    except OSError as exc:
        raise Unreadable(f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise Unreadable(f"{source} is not UTF-8 text (byte {exc.start})") from None


def loads(text: str, source: str) -> Any:
    """Parse ``text``; ``Unreadable`` (one line) when it is not JSON an event can hold."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"{source} is nested too deeply to read") from None
    except ValueError as exc:
        raise Unreadable(f"{source} is not JSON: {_first_line(str(exc))}") from None
    if depth(value) > MAX_DEPTH + 2:  # the event itself and a list of events around it
        raise Unreadable(f"{source} nests deeper than {MAX_DEPTH} levels: no event can hold it")
    return value


def depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) \
            else ()
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, dict | list))
    return deepest


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else "unreadable"
