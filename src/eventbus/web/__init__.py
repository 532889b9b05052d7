"""The push transport: the Flask app, the functions-framework target, the one status table.

* ``app``: ``create_app(router, settings)`` and ``push_target(app)``;
* ``service``: ``PushService``, one push request from auth to the request line;
* ``status``: the only place where outcomes and errors become HTTP statuses;
* ``logs``: structured JSON lines with Cloud Logging's ``severity``.

May import every layer below it (model, store, processor, outbox, pubsub)
and Flask. Nothing below imports it.
"""
