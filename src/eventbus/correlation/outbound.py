"""Request lines for calls this service makes: one ``REQUEST_OUTBOUND`` line per call.

Seed 004 ("Centrally monitor your requests status") logs every incoming and
outgoing request with the same fields; the inbound line is written by
``eventbus.web.service``, the outbound ones here, for each partner call
(``eventbus.correlation.session``) and each publish (``eventbus.pubsub.publisher``,
so the relay, the console script and ``publish()`` alike). A line has:

* seed 004's fields: ``logType``, ``service`` (added by the formatter),
  ``method``, ``host``, ``path``, ``status``, ``requestId``, ``duration``
  (milliseconds);
* ``target`` (the URL or the topic), ``error`` (the exception's class) when
  the call failed, ``idempotency_key`` when the call carries one;
* Cloud Logging's ``httpRequest`` object, and (from the formatter) its
  ``logging.googleapis.com/trace``, so the call shows under the request or
  message that made it.

Pure: the standard library and ``eventbus.correlation.tracecontext`` only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from eventbus.correlation import tracecontext

OUTBOUND = "REQUEST_OUTBOUND"
INBOUND = "REQUEST_INBOUND"
logger = logging.getLogger("eventbus.outbound")


def latency(seconds: float) -> str:
    """Return a duration as Cloud Logging's ``httpRequest.latency`` wants it: ``"0.123s"``."""
    return f"{max(seconds, 0.0):.3f}s"


def http_request(method: str, url: str, status: int | None, seconds: float, *,
                 remote_ip: str = "", user_agent: str = "",
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return Cloud Logging's ``httpRequest`` object for one request.

    ``status`` None (the call never got an answer) leaves the status out.
    """
    entry: dict[str, Any] = {"requestMethod": method, "requestUrl": url,
                             "latency": latency(seconds)}
    if status is not None:
        entry["status"] = status
    if remote_ip:
        entry["remoteIp"] = remote_ip
    if user_agent:
        entry["userAgent"] = user_agent
    entry.update(extra or {})
    return entry


@contextmanager
def outbound_call(method: str, host: str, path: str, *, target: str, key: str = "",
                  kind: str = "http") -> Iterator[dict[str, Any]]:
    """Time one outbound call and write its line when it ends, with its status or error.

    The block sets ``status`` (an int) in the dict it gets; an exception out
    of the block is the call's error (its class is logged; it is re-raised).
    """
    answer: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        yield answer
    except BaseException as exc:
        write(method, host, path, target=target, key=key, kind=kind,
              seconds=time.perf_counter() - started, error=type(exc).__name__)
        raise
    write(method, host, path, target=target, key=key, kind=kind,
          seconds=time.perf_counter() - started, status=answer.get("status"))


def write(method: str, host: str, path: str, *, target: str, seconds: float,
          status: int | None = None, error: str = "", key: str = "",
          kind: str = "http") -> None:
    """Write one ``REQUEST_OUTBOUND`` line (WARNING when it failed or answered >= 400)."""
    fields: dict[str, Any] = {
        "logType": OUTBOUND, "kind": kind, "method": method, "host": host, "path": path,
        "target": target, "requestId": tracecontext.current_request_id(),
        "duration": round(seconds * 1000, 2),
        "httpRequest": http_request(method, target, status, seconds),
    }
    if status is not None:
        fields["status"] = status
    if error:
        fields["error"] = error
    if key:
        fields["idempotency_key"] = key
    failed = bool(error) or (status is not None and status >= 400)
    logger.log(logging.WARNING if failed else logging.INFO, "%s %s %s", method, target,
               error or status, extra=fields)
