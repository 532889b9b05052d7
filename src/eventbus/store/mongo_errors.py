"""The MongoDB store's error rule, shared by the store and its mixins.

Every pymongo failure becomes ``StoreUnavailable`` (retried: Pub/Sub redelivers),
except content the server or the driver refuses, which becomes
``ContentRejected`` (never retried: the same content fails the same way).
"""

from __future__ import annotations

from types import TracebackType

from bson.errors import InvalidDocument, InvalidStringData
from pymongo.errors import OperationFailure, PyMongoError

from eventbus.model.errors import ContentRejected, StoreUnavailable
from eventbus.store import documents


class unavailable:  # noqa: N801 - used as a function: ``with unavailable("claim", key):``
    """Turn a refusal of the content into ``ContentRejected``, other failures ``StoreUnavailable``.

    The first is never retried (the same content fails the same way); the
    processor's own checks (``eventbus.model.content``) catch nearly all of
    it before, this is the backstop for what a particular server refuses.
    A class rather than a ``@contextmanager`` generator: every store call
    enters one, and a generator costs a push several microseconds more.
    """

    __slots__ = ("action", "key")

    def __init__(self, action: str, key: str = "") -> None:
        self.action, self.key = action, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc is None:
            return
        action, key = self.action, self.key
        if isinstance(exc, _CONTENT_ERRORS):
            raise ContentRejected(f"{action}: the store refused the content: "
                                  f"{type(exc).__name__}") from exc
        if isinstance(exc, OperationFailure) and exc.code in CONTENT_ERROR_CODES:
            raise ContentRejected(f"{action}: the store refused the content: "
                                  f"code {exc.code}") from exc
        if isinstance(exc, PyMongoError):
            raise StoreUnavailable(f"{action} {key!r}: {type(exc).__name__}: {exc}") from exc


# What the driver raises for content it cannot encode: too large, bad keys or
# text, integers past 64 bits, nesting beyond the encoder's recursion.
_CONTENT_ERRORS = (InvalidDocument, InvalidStringData, OverflowError, UnicodeEncodeError,
                   RecursionError)
CONTENT_ERROR_CODES = documents.CONTENT_ERROR_CODES
"""Server error codes that mean "this content cannot be stored" (``documents.refuses_content``)."""
