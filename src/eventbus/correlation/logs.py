"""Structured JSON logs, one object per line, with Cloud Logging's ``severity``.

Cloud Run and Cloud Functions parse JSON lines on stdout into structured
entries, so ``severity`` sets the level and every other key is searchable.

Every line written inside a telemetry scope (a push request, a message, a
relayed child: ``eventbus.correlation.tracecontext``) also carries Cloud Logging's
``logging.googleapis.com/trace`` (``projects/<project>/traces/<trace id>``),
``.../spanId`` and ``.../trace_sampled``, and the scope's ``requestId``, so
Cloud Logging shows a request's lines (and a cascade's) together and next
to its trace. Request lines also carry an ``httpRequest`` object.

The request line is written once per push, so it has a direct path: when
the ``eventbus`` loggers are as ``configure()`` left them (its one
``JsonLineHandler``, no filters, nothing else listening), the line goes
straight to that handler's stream, formatted by the same code as any other
line, without a ``LogRecord``. The stdlib's record, handler and formatter
calls cost a push about 50 µs of CPU (a sixth of the framework's own).
Any other set-up (an application's handlers, pytest's ``caplog``) gets the
ordinary path and the same line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from eventbus.correlation import tracecontext

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_SEVERITY = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_REQUESTS = logging.getLogger("eventbus.request")
TRACE = "logging.googleapis.com/trace"
SPAN_ID = "logging.googleapis.com/spanId"
TRACE_SAMPLED = "logging.googleapis.com/trace_sampled"
# One encoder for every line: ``json.dumps`` with an option builds a new one per call.
_LINE = json.JSONEncoder(default=str)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object; ``extra`` fields become top-level keys."""

    def __init__(self, service: str, project: str = "") -> None:
        super().__init__()
        self.service, self.project = service, project or "-"

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as a JSON line."""
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        stack = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(record.levelname, record.getMessage(), record.name, record.created,
                         fields, stack)

    def line(self, level_name: str, message: str, logger: str, created: float,
             fields: Mapping[str, Any], stack_trace: str | None = None) -> str:
        """Return one JSON line: the common keys, then ``fields``, then the scope's trace."""
        entry: dict[str, Any] = {
            "severity": _SEVERITY.get(level_name, level_name),
            "message": message, "logger": logger, "service": self.service,
            "timestamp": _iso(dt.datetime.fromtimestamp(created, dt.UTC)),
        }
        entry.update(fields)
        self._correlate(entry)
        if stack_trace:
            entry["stack_trace"] = stack_trace
        return _LINE.encode(entry)

    def _correlate(self, entry: dict[str, Any]) -> None:
        """Add the current scope's trace and request id, unless the line has its own."""
        if TRACE not in entry:
            trace = tracecontext.current_trace()
            if trace is not None:
                entry[TRACE] = trace.cloud_trace(self.project)
                entry[SPAN_ID] = trace.span_id
                entry[TRACE_SAMPLED] = trace.sampled
        if not entry.get("requestId"):
            request_id = tracecontext.current_request_id()
            if request_id:
                entry["requestId"] = request_id


class JsonLineHandler(logging.StreamHandler):
    """``configure()``'s handler: JSON lines on a stream, with a direct path for request lines."""

    def __init__(self, stream: TextIO, formatter: JsonFormatter) -> None:
        super().__init__(stream)
        self.setFormatter(formatter)

    def write_line(self, formatter: JsonFormatter, level: int, message: str, logger: str,
                   fields: Mapping[str, Any]) -> None:
        """Write one line as ``emit`` would (``formatter``: this handler's), without a record."""
        try:
            text = formatter.line(logging.getLevelName(level), message, logger, time.time(),
                                  fields)
            self.acquire()  # ``emit``'s write and flush, under the handler's lock
            try:
                self.stream.write(text + self.terminator)
                self.flush()
            finally:
                self.release()
        except Exception:  # as the stdlib's emit: a broken stream never fails the request
            self.handleError(logging.makeLogRecord({"msg": message, "name": logger}))


def configure(service: str, level: str = "INFO", stream: TextIO | None = None,
              loggers: tuple[str, ...] = ("eventbus",), project: str = "") -> None:
    """Send ``loggers`` (and their children) to ``stream`` as JSON lines, once.

    Handlers log through ``context.log``, a child of ``eventbus``; an
    application adds its own loggers' names here. ``project`` names the
    Google Cloud project in the lines' trace field.
    """
    handler = JsonLineHandler(stream or sys.stdout, JsonFormatter(service, project))
    for name in loggers:
        log = logging.getLogger(name)
        log.handlers = [handler]
        log.setLevel(level.upper())
        log.propagate = False


def severity_for(status: int, outcome: str = "") -> int:
    """Return the level of a request line: ERROR for a stored failure, WARNING for a nack."""
    if outcome == "rejected" or (status >= 500 and outcome == ""):
        return logging.ERROR
    if status >= 300:
        return logging.WARNING
    return logging.INFO


def request_line(fields: Mapping[str, Any], level: int | None = None) -> None:
    """Emit the one ``REQUEST_INBOUND`` line of a request (seed 004's fields).

    ``level``: the caller's (a push's outcome has its own); else ``severity_for``.
    """
    if level is None:
        level = severity_for(int(fields.get("status", 0)), str(fields.get("outcome", "")))
    if not _REQUESTS.isEnabledFor(level):
        return
    message = f"{fields.get('method')} {fields.get('path')} {fields.get('status')}"
    extra = {"logType": "REQUEST_INBOUND", **fields}
    direct = _direct_handler(level)
    if direct is not None and isinstance(direct.formatter, JsonFormatter):
        direct.write_line(direct.formatter, level, message, _REQUESTS.name, extra)
        return
    # makeRecord + handle, not log(): the line's caller is always this
    # function, so the frame walk that log() does to find it is skipped.
    _REQUESTS.handle(_REQUESTS.makeRecord(_REQUESTS.name, level, __file__, 0, message, (),
                                          None, func="request_line", extra=extra))


def _direct_handler(level: int) -> JsonLineHandler | None:
    """``configure()``'s handler when it alone would see a request line at ``level``."""
    parent = _REQUESTS.parent
    if (_REQUESTS.handlers or _REQUESTS.filters or not _REQUESTS.propagate
            or parent is None or parent.propagate or parent.filters
            or len(parent.handlers) != 1):
        return None
    handler = parent.handlers[0]
    if type(handler) is not JsonLineHandler or handler.filters or level < handler.level:
        return None
    return handler


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
