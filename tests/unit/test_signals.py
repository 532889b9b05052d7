"""``eventbus.web.signals``: SIGTERM starts the processor's stop, then the server's own handler."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from eventbus.web.signals import on_gunicorn_worker, stop_first


def test_the_stop_starts_and_the_servers_handler_still_runs() -> None:
    stopped, served = threading.Event(), []

    def server(number: int, frame: FrameType | None) -> None:
        served.append(number)

    previous = signal.signal(signal.SIGUSR2, server)
    try:
        assert stop_first(stopped.set, signal.SIGUSR2)
        signal.raise_signal(signal.SIGUSR2)
        assert stopped.wait(5) and served == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_off_the_main_thread_nothing_is_wrapped() -> None:
    answers: list[bool] = []
    worker = threading.Thread(target=lambda: answers.append(stop_first(lambda: None)))
    worker.start()
    worker.join()
    assert answers == [False]


def test_a_gunicorn_worker_without_an_eventbus_app_is_left_alone() -> None:
    class Worker:
        wsgi: Any = object()

    before = signal.getsignal(signal.SIGTERM)
    on_gunicorn_worker(Worker())
    assert signal.getsignal(signal.SIGTERM) is before
