"""A ``.env`` file for the ``eventbus`` console script, read as python-dotenv and Flask read it.

``make run`` writes the local settings (database, emulator, project, topic,
console token) to ``.env`` at the repository root, so every command it
prints works as printed in a fresh shell. The console script looks for
``.env`` in the current directory, then in its parents up to the first one
that holds ``.git``; real environment variables win over the file.

The format is the common subset: ``KEY=VALUE`` or ``export KEY=VALUE``;
blank lines and ``#`` comments; ``'single'`` quotes taken literally,
``"double"`` quotes with ``\\n``, ``\\t``, ``\\"`` and ``\\\\`` escapes; an
unquoted value ends at `` #``. No variable expansion, no multi-line values.
A line that does not parse is skipped (``parse`` reports it), never fatal:
the file is a convenience, not a configuration language.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import MutableMapping
from pathlib import Path

FILENAME = ".env"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
# Bigger than any settings file; a larger one is not ours and is ignored.
MAX_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Parsed:
    """What a ``.env`` text holds: its variables, and the numbers of the lines skipped."""

    values: dict[str, str]
    skipped: tuple[int, ...] = ()


def parse(text: str) -> Parsed:
    """Return the variables of a ``.env`` text; later lines override earlier ones."""
    values: dict[str, str] = {}
    skipped: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pair = parse_line(stripped)
        if pair is None:
            skipped.append(number)
        else:
            values[pair[0]] = pair[1]
    return Parsed(values, tuple(skipped))


def parse_line(line: str) -> tuple[str, str] | None:
    """Return ``(key, value)`` of one non-comment line, or None when it does not parse."""
    if line.startswith("export ") or line.startswith("export\t"):
        line = line[len("export"):].lstrip()
    key, equals, rest = line.partition("=")
    key = key.strip()
    if not equals or not _KEY.fullmatch(key):
        return None
    value = _value(rest.strip())
    if value is None or "\x00" in value:
        return None
    return key, value


def _value(text: str) -> str | None:
    if text[:1] == "'":
        value, quote, rest = text[1:].partition("'")
        return value if quote and _only_comment(rest) else None
    if text[:1] == '"':
        return _double_quoted(text)
    cut = re.search(r"\s#", text)
    return (text[:cut.start()] if cut else text).strip()


def _double_quoted(text: str) -> str | None:
    out: list[str] = []
    index = 1
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            out.append(_ESCAPES.get(text[index + 1], "\\" + text[index + 1]))
            index += 2
            continue
        if char == '"':
            return "".join(out) if _only_comment(text[index + 1:]) else None
        out.append(char)
        index += 1
    return None  # unterminated


def _only_comment(rest: str) -> bool:
    rest = rest.strip()
    return not rest or rest.startswith("#")


def find(start: Path | None = None) -> Path | None:
    """Return the ``.env`` of ``start`` (default: the current directory) or of its parents.

    The search stops at the first directory that holds ``.git``: a ``.env``
    above the repository belongs to something else.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / FILENAME
        if candidate.is_file():
            return candidate
        if (folder / ".git").exists():
            return None
    return None


def load(start: Path | None = None,
         environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Set the variables of the nearest ``.env`` that are not set yet; return its path."""
    path = find(start)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    env = os.environ if environ is None else environ
    for key, value in parse(text).values.items():
        env.setdefault(key, value)  # the real environment wins, as in python-dotenv
    return path
