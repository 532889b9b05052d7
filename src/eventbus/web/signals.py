"""SIGTERM under a server: the processor's ``stop`` first, then the server's own handler.

Cloud Run (and gunicorn's master on a restart) sends SIGTERM, then waits for
the server's graceful timeout before a SIGKILL. The servers wait for the
requests in flight, but nothing tells the processor: a push whose ``async
def`` handler awaits a partner holds its request open until the kill, and its
record stays PROCESSING with its attempt spent. ``Processor.stop`` is what
gives such events back (cancelled after ``async_stop_grace_seconds``: 503,
PENDING, the attempt not spent), so the request ends and the server exits.

Hand-written because neither server gives an app a hook at the signal
itself: gunicorn's worker hooks run at start and exit (``post_worker_init``
is before the signal, ``worker_exit`` after the requests ended), and
uvicorn's lifespan shutdown starts only once every connection closed. So the
handler the server installed is wrapped: ``stop`` is started, then the
server's handler runs as before. ``gunicorn.conf.py`` does it for the Flask
app (``post_worker_init``); ``asgi_app``'s lifespan does it for uvicorn, whose
handler is installed only when it serves.

May import: the standard library only.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


def stop_first(stop: Callable[[], None], signum: int = signal.SIGTERM) -> bool:
    """Wrap ``signum``'s current handler so that ``stop`` starts first; False off the main thread.

    ``stop`` runs on a thread of its own: a signal handler runs between two
    bytecodes of the main thread, which may hold a lock ``stop`` takes.
    """
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread may set a handler (and receives the signal)
    previous = signal.getsignal(signum)

    def handle(number: int, frame: FrameType | None) -> None:
        threading.Thread(target=stop, name="eventbus-stop", daemon=True).start()
        _chain(previous, number, frame)

    signal.signal(signum, handle)
    return True


def _chain(previous: Any, number: int, frame: FrameType | None) -> None:
    if callable(previous):
        previous(number, frame)
    elif previous == signal.SIG_DFL:  # the default (exit): as it would have been
        signal.signal(number, signal.SIG_DFL)
        signal.raise_signal(number)


def on_gunicorn_worker(worker: Any) -> None:
    """gunicorn's ``post_worker_init`` hook: the worker's app's processor stops on SIGTERM.

    ``worker.wsgi`` is the app gunicorn loaded; an app not made by
    ``create_app`` (no ``eventbus`` extension) is left as it is.
    """
    extensions = getattr(getattr(worker, "wsgi", None), "extensions", None)
    service = extensions.get("eventbus") if isinstance(extensions, dict) else None
    if service is not None:
        stop_first(service.processor.stop)
