"""gunicorn settings for Cloud Run and local runs: ``gunicorn -c gunicorn.conf.py main:app``."""

import os

# Cloud Run tells the container which port to listen on; a container listens on every
# interface (HOST's default). `make run` passes --bind 127.0.0.1:$PORT (infra/run-local.sh:
# push auth is off locally, so the local service is not opened to the network).
bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8080')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
# Longer than the push ack deadline (default 60 s here), so gunicorn never
# kills a handler that Pub/Sub is still waiting for.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "120"))
graceful_timeout = 20
# Payload unwrapping delivers attributes such as idempotency_key as headers;
# gunicorn drops headers with underscores unless told to keep them.
header_map = "dangerous"
accesslog = None  # eventbus writes one structured line per request instead
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()


def post_worker_init(worker):
    """On SIGTERM, stop the app's processor first: async handlers still awaiting after
    ``EVENTBUS_ASYNC_STOP_GRACE_SECONDS`` give their events back (503, PENDING, the attempt
    not spent) instead of holding their requests until gunicorn's SIGKILL."""
    from eventbus.web.signals import on_gunicorn_worker

    on_gunicorn_worker(worker)
