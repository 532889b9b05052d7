"""``logged(name)``: the log records a block emits, whatever earlier tests did to logging.

pytest's ``caplog`` reads through the root logger, which misses a logger an
earlier test stopped propagating, disabled (``logging.config``'s
``disable_existing_loggers``) or raised above INFO; this handler sits on the
logger itself and undoes those for the block.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Kept(logging.Handler):
    """A handler that keeps every record it is given."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records of logger ``name`` (and its children) at INFO and above while the block
    runs; the logger's level, ``disabled`` and ``logging.disable`` are restored after."""
    handler = _Kept(logging.INFO)
    target = logging.getLogger(name)
    level, disabled, muted = target.level, target.disabled, logging.root.manager.disable
    target.setLevel(logging.INFO)
    target.disabled = False
    logging.disable(logging.NOTSET)
    target.addHandler(handler)
    try:
        yield handler.records
    finally:
        target.removeHandler(handler)
        target.setLevel(level)
        target.disabled = disabled
        logging.disable(muted)
