"""The push transport: the Flask app, the functions-framework target, the one status table.

* ``app``: ``create_app(router, settings)`` and ``push_target(app)``;
* ``service``: ``PushService``, one push request from auth to the request line;
* ``http_status``: the only place where outcomes and errors become HTTP statuses;
* ``asgi``: ``asgi_app(app)``, the same service as an ASGI app (Starlette);
* ``signals``: SIGTERM on Cloud Run: stop taking pushes, finish the ones in flight;
* ``console``: the operators' web console (``mount_console``, ``create_console_app``).

The request line and the JSON log lines are ``eventbus.correlation.logs``'.

May import every layer below it (model, store, processor, outbox, pubsub)
and Flask. Nothing below imports it.
"""
