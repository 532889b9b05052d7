"""What a store can keep: the salvage rule's checks and bounded forms, pure and stack-safe.

Everything in a message is written by someone else. A document the store
would refuse for its content (too deep, too large, integers past 64 bits,
text that is not valid Unicode, NUL in a key) must never turn into a 503
loop: ``problem()`` names what is wrong before anything is stored, the same
way for the in-memory and the MongoDB store, and the processor then stores
the message FAILED for good in a bounded form (``bounded_text``,
``payload_summary``). MongoDB's own refusals are a backstop
(``eventbus.store.mongo`` maps them to ``ContentRejected``).

The walk is iterative, so a hostile nesting depth cannot exhaust the stack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 48
"""Deepest nesting of a stored value; MongoDB allows 100 levels for the whole document,
and a child's data sits three levels down in its parent's outbox."""
MAX_BYTES = 8 * 1024 * 1024
"""Largest estimated BSON size of what one record stores (MongoDB's cap is 16 MiB)."""
MAX_REJECTED_DATA_BYTES = 256 * 1024
"""A rejected event keeps its ``entity_data`` only below this size; above, the bounded raw copy."""
RAW_PAYLOAD_CHARS = 16 * 1024
"""How much of a refused payload is kept, safely encoded, for operators to read."""
_INT64 = (-(2**63), 2**63 - 1)
# Digits become NUL, which JSON text never holds raw (it escapes control
# characters): a run of 19 digits is then one C-speed substring search, where
# a regex tries a match at every position (most of a push's validation).
_DIGITS_TO_NUL = bytes.maketrans(b"0123456789", b"\0" * 10)
_NINETEEN_DIGITS = b"\0" * 19
# Approximate BSON sizes: type byte + key + NUL, then the value.
_ELEMENT_OVERHEAD = 2
_SCALAR_BYTES = 8


def problem(document: Mapping[str, Any], text: str | None = None) -> str | None:
    """Return why a store would refuse ``document`` (with its nested values), or None.

    ``text``, the document's JSON when the caller has it, lets the common case
    skip the walk: ``surely_storable(text)`` proves it in a few C-speed scans.
    """
    if text is not None and surely_storable(text):
        return None
    size = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        found, weight = _scalar(value)
        if found:
            return found
        size += weight
        if size > MAX_BYTES:
            return f"larger than {MAX_BYTES // (1024 * 1024)} MiB once stored"
        children, extra = _children(value)
        if isinstance(children, str):
            return children
        size += extra
        stack.extend((child, depth + 1) for child in children)
    return None


def stored_size(document: Mapping[str, Any]) -> int:
    """Return the estimated BSON size of ``document``, as ``problem`` counts it for ``MAX_BYTES``.

    ``problem`` stops counting at the first thing a store refuses, or once
    past the cap; this counts everything, so a refusal can say how large the
    document is (a publisher's ``EventTooLarge``). What ``problem`` would
    refuse for another reason is counted as it stands (an integer past 64 bits
    as a number, a key that is not text by its ``str``). Iterative, as ``problem``.
    """
    size = 0
    stack: list[Any] = [document]
    while stack:
        value = stack.pop()
        size += _weight(value)
        if isinstance(value, Mapping):
            size += sum(len(key if isinstance(key, str) else str(key)) + 1 for key in value)
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            size += len(value) * 7
            stack.extend(value)
    return size


def surely_storable(text: str) -> bool:
    """Return True when the JSON ``text`` of a document surely holds nothing a store refuses.

    Each test only errs on the side of "not sure" (then ``problem`` walks):
    a short text cannot grow past the size cap once stored (BSON takes at most
    about 7 bytes per JSON character), fewer brackets than the depth cap cannot
    nest deeper, no run of 19 digits means no integer past 64 bits, no escaped
    NUL means no NUL in a key, and a strict UTF-8 encoding means no lone surrogate.
    """
    if len(text) * 8 > MAX_BYTES or "\\u0000" in text:
        return False
    if text.count("{") + text.count("[") > MAX_DEPTH:
        return False
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return _NINETEEN_DIGITS not in raw.translate(_DIGITS_TO_NUL)


def _scalar(value: Any) -> tuple[str, int]:
    """Return (problem, estimated bytes) of one value, not counting what it contains."""
    if isinstance(value, str):
        return _text_problem(value, "a string"), _ELEMENT_OVERHEAD + 5 + len(value)
    if isinstance(value, bool) or value is None:
        return "", _ELEMENT_OVERHEAD + 1
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        return "an integer does not fit in 64 bits", 0
    return "", _ELEMENT_OVERHEAD + _SCALAR_BYTES


def _weight(value: Any) -> int:
    """The estimated bytes of one value, not counting what it contains: ``_scalar``'s weights."""
    if isinstance(value, str):
        return _ELEMENT_OVERHEAD + 5 + len(value)
    if isinstance(value, bool) or value is None:
        return _ELEMENT_OVERHEAD + 1
    return _ELEMENT_OVERHEAD + _SCALAR_BYTES


def _children(value: Any) -> tuple[list[Any] | str, int]:
    """Return the values inside ``value`` and the bytes of their keys, or a problem."""
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                return f"a key is {type(key).__name__}, not text", 0
            if "\x00" in key:
                return "a key holds a NUL character", 0
            found = _text_problem(key, "a key")
            if found:
                return found, 0
        return list(value.values()), sum(len(key) + 1 for key in value)
    if isinstance(value, list | tuple):
        # Array elements are keyed "0", "1", ... in BSON.
        return list(value), len(value) * 7
    return [], 0


def _text_problem(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode (a lone surrogate)"
    return ""


def bounded_text(raw: bytes | str, limit: int = RAW_PAYLOAD_CHARS) -> str:
    """Return at most ``limit`` characters of ``raw`` that any store keeps: escapes, not errors.

    Invalid UTF-8 bytes and lone surrogates become backslash escapes, and NUL
    becomes ``\\x00``, so the copy is readable and storable whatever came in.
    """
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    text = data[: limit * 4].decode("utf-8", "backslashreplace")
    return text.replace("\x00", "\\x00")[:limit]


def safe_text(value: Any, limit: int = 256) -> str:
    """Return ``value`` as storable text of at most ``limit`` characters ("" for non-text)."""
    return bounded_text(value, limit) if isinstance(value, str) else ""


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """Return ``str(exc)`` as storable text of at most ``limit`` characters; never raises.

    An exception comes from anyone's code (a handler, an upcaster, a forward's
    mapping): its message may hold lone surrogates (which no store keeps and
    which would turn a transient failure into a refused write), NUL, or
    megabytes, and its ``__str__`` may itself raise. The message is cut
    before it is escaped, so a huge one costs no more than ``limit``.
    """
    try:
        return bounded_text(str(exc)[:limit], limit)
    except Exception:  # any __str__ at all: the type still says what failed
        return f"<{bounded_text(type(exc).__name__, 200)}: message unavailable>"


def payload_summary(raw: bytes) -> dict[str, Any]:
    """Return what is kept of a refused payload: size, SHA-256 and a bounded copy."""
    return {"payload_size": len(raw), "payload_sha256": hashlib.sha256(raw).hexdigest(),
            "raw_payload": bounded_text(raw)}
