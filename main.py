"""Entry points: ``app`` for gunicorn (Cloud Run), ``asgi_app`` for uvicorn, ``pubsub_push``
for functions-framework: one service, the same endpoint, answers and logs.

    gunicorn -c gunicorn.conf.py main:app
    uvicorn main:asgi_app --host 0.0.0.0 --port 8080
    functions-framework --target pubsub_push --signature-type http

The environment is read once (``handlers.AppSettings``); the app owns its router.
"""

from eventbus import asgi_app as asgi_entry
from eventbus import create_app, push_target
from handlers import AppSettings, create_router

settings = AppSettings.from_env()
app = create_app(create_router(settings), settings.eventbus)
pubsub_push = push_target(app)
asgi_app = asgi_entry(app)
