"""Correlation: the trace context and request id every log line and outbound call carries.

* ``tracecontext``: W3C ``traceparent`` and Google's ``X-Cloud-Trace-Context``
  parsed strictly, and the current scope (the request or message a line
  belongs to); children carry their parent's context in their attributes;
* ``outbound``: the ``REQUEST_OUTBOUND`` line and Cloud Logging's ``httpRequest``;
* ``session``: a ``requests`` session that writes one outbound line per call;
* ``async_session``: the same for an ``httpx.AsyncClient`` (a transport wrapper);
* ``logs``: the JSON log format (seed 004's fields, Cloud Logging's ``severity``
  and trace), the push's ``REQUEST_INBOUND`` line; the app and the worker configure it.

This is the small stdlib-only path that groups log lines by request and by
cascade in Cloud Logging with telemetry off and without OpenTelemetry
installed; spans and metrics are ``eventbus.telemetry``'s.

May import: the standard library (``requests`` in ``session`` only, httpx in
``async_session`` only). Nothing else of ``eventbus``.
"""
