"""Werkzeug's development server, with access lines that never carry the console's token.

The local console is opened once with ``/?token=...``; Werkzeug logs every
request line as it came, so the token would sit in ``var/console.log``. Its
public ``WSGIRequestHandler`` is subclassed so that ``log`` (which every
access and error line goes through) replaces any ``token=`` value; nothing
else changes.
"""

from __future__ import annotations

import re
from typing import Any

from werkzeug.serving import WSGIRequestHandler

_TOKEN = re.compile(r"([?&]token=)[^&\s]*")


def redacted(line: str) -> str:
    """``line`` with the value of every ``token`` query parameter replaced by ``***``."""
    return _TOKEN.sub(r"\1***", line)


class RedactingHandler(WSGIRequestHandler):
    """A request handler whose access log lines have the token redacted."""

    def log(self, type: str, message: str, *args: Any) -> None:
        """Log as Werkzeug does (access lines and errors), with every token redacted."""
        super().log(type, redacted(message),
                    *(redacted(arg) if isinstance(arg, str) else arg for arg in args))
