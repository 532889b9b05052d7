"""Entry points: ``app`` for gunicorn (Cloud Run), ``pubsub_push`` for functions-framework.

    gunicorn -c gunicorn.conf.py main:app
    functions-framework --target pubsub_push --signature-type http

Both read the environment once (see ``eventbus.config``) and import the
handler modules named by ``EVENTBUS_HANDLER_MODULES`` (default ``handlers``).
"""

from eventbus.app import create_app, push_target

app = create_app()
pubsub_push = push_target(app)
