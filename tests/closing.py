"""What a test's helper builds and the test never closes itself is closed when the test ends.

A helper that returns something that keeps threads (a ``LocalBus``, a ``Processor``, a
``Verifier``, a ``PullWorker``...) to a test that uses it to the end passes it through
``closed_after_test`` (an app of ``create_app``: ``app_closed_after_test``, its processor
closed): the root conftest's autouse fixture closes every one at the test's teardown, newest
first, before the leak check (``tests/leaks.py``) looks. For the test (function) scope only:
a wider fixture closes its own. A hypothesis test that builds one per example closes each at
the example's end instead (``with closed_here(thing):``), so the examples' threads and stores
do not pile up until the test ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    import flask


class Closable(Protocol):
    """Anything with a ``close()``."""

    def close(self) -> None:
        """Stop what it runs."""
        ...


_C = TypeVar("_C", bound=Closable)
_OPEN: list[Closable] = []


def closed_after_test(thing: _C) -> _C:
    """Return ``thing``, closed when the running test ends."""
    _OPEN.append(thing)
    return thing


@contextlib.contextmanager
def closed_here(thing: _C) -> Iterator[_C]:
    """Yield ``thing``; close it when the block ends (and not again when the test does)."""
    try:
        yield thing
    finally:
        _OPEN[:] = [kept for kept in _OPEN if kept is not thing]
        thing.close()


def app_closed_after_test(app: flask.Flask) -> flask.Flask:
    """Return ``app`` (``create_app``'s), its processor closed when the running test ends."""
    closed_after_test(app.extensions["eventbus"].processor)
    return app


def close_all() -> None:
    """Close what ``closed_after_test`` was given since the last call, newest first; every one
    is closed even if one raises (the first error is raised after)."""
    error: BaseException | None = None
    while _OPEN:
        try:
            _OPEN.pop().close()
        except BaseException as exc:  # the others still close
            error = error or exc
    if error is not None:
        raise error
