"""Which store errors mean "this content cannot be stored", not "the store is down"."""

from __future__ import annotations

CONTENT_ERROR_CODES = frozenset({
    15,     # Overflow: nesting depth exceeded
    52,     # DollarPrefixedFieldName
    10334,  # BSONObjectTooLarge
    17280,  # KeyTooLong
    17419,  # a resulting document would be too large
})
"""Server error codes that mean "this content cannot be stored", not "the store is down"."""

_CONTENT_ERROR_CLASSES = frozenset({"InvalidDocument", "InvalidStringData", "DocumentTooLarge"})
_ENCODING_ERRORS = (OverflowError, UnicodeEncodeError, RecursionError)


def refuses_content(exc: BaseException) -> bool:
    """Return True when ``exc`` is a store refusing content, which no retry can change.

    A document over the size limit, a value or a key the server or the driver
    cannot hold. Matched by the server's error code and the driver's error
    class names (this module imports no driver: the memory store and the
    MongoDB store share the rule); everything else, a connection or a
    timeout, is left to the classifier (transient).
    """
    if isinstance(exc, _ENCODING_ERRORS):
        return True
    if getattr(exc, "code", None) in CONTENT_ERROR_CODES:
        return True
    return any(cls.__name__ in _CONTENT_ERROR_CLASSES for cls in type(exc).__mro__)
