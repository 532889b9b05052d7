"""Entry points: ``app`` for gunicorn (Cloud Run), ``pubsub_push`` for functions-framework.

    gunicorn -c gunicorn.conf.py main:app
    functions-framework --target pubsub_push --signature-type http

The environment is read once (``handlers.AppSettings``); the app owns its router.
"""

from eventbus import create_app, push_target
from handlers import AppSettings, create_router

settings = AppSettings.from_env()
app = create_app(create_router(settings), settings.eventbus)
pubsub_push = push_target(app)
