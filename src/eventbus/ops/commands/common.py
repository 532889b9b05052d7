"""What every operator command shares: its tools, the filter options, and output."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

from eventbus.model.delivery import Delivery
from eventbus.ops.config import OpsSettings
from eventbus.ops.render import to_json
from eventbus.ops.replay import routerless
from eventbus.ops.reports import failed_query
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings
from eventbus.store.operator_queries import EventQuery

_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(Exception):
    """Raised when a command's arguments cannot be used; exit status 2."""


@dataclasses.dataclass
class Tools:
    """What a command works with; ``eventbus.ops.cli`` builds it, tests build their own."""

    settings: Settings
    ops: OpsSettings
    open_store: Callable[[], Any]
    open_publisher: Callable[[float], MessagePublisher]
    out: TextIO = dataclasses.field(default_factory=lambda: sys.stdout)
    err: TextIO = dataclasses.field(default_factory=lambda: sys.stderr)
    stdin: TextIO = dataclasses.field(default_factory=lambda: sys.stdin)
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    _store: Any = None

    def store(self) -> Any:
        """Return the store, opened on first use."""
        if self._store is None:
            self._store = self.open_store()
        return self._store

    def publisher(self, timeout: float = 30.0) -> MessagePublisher:
        """Return a publisher to the settings' topic."""
        return self.open_publisher(timeout)

    def emit(self, data: Any, text: str, args: argparse.Namespace) -> None:
        """Print ``data`` as JSON with ``--json``, else ``text``."""
        print(to_json(data) if getattr(args, "json", False) else text, file=self.out)


def since(text: str) -> dt.datetime:
    """Parse ``--since``: a duration back from now (``90m``, ``2h``, ``7d``) or an ISO time."""
    match = _SINCE.fullmatch(text.strip())
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration like 2h or 7d, nor an ISO time: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def duration(text: str) -> dt.timedelta:
    """Parse a duration: ``90m``, ``2h``, ``7d``, or a number of seconds (``0`` allowed)."""
    match = _SINCE.fullmatch(text.strip())
    if match:
        return dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration like 90m or 2h: {text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite duration, not negative: {text!r}")
    return dt.timedelta(seconds=seconds)


def positive(text: str) -> int:
    """Parse a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above zero: {text!r}")
    return value


def wait_seconds(text: str) -> float:
    """Parse a long poll's wait: seconds above zero (a fraction allowed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above zero: {text!r}")
    return value


def rate(text: str) -> float:
    """Parse ``--rate``: events per second, as ``5``, ``5/s`` or ``0.5/s``."""
    number = text.strip().removesuffix("/s")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate like 5/s: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above zero: {text!r}")
    return value


def add_json(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_filters(parser: argparse.ArgumentParser) -> None:
    """Add the failed-event filters: ``--type --partner --since --retryable/--final``."""
    parser.add_argument("--type", dest="event_type", help="only this event_type")
    parser.add_argument("--partner", help="only this entity_metadata.partnerId")
    parser.add_argument("--since", type=since, help="created since: 2h, 7d or an ISO time")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--retryable", dest="retryable", action="store_const", const=True,
                       help="only those still being retried")
    which.add_argument("--final", dest="retryable", action="store_const", const=False,
                       help="only those FAILED for good")


def filters_given(args: argparse.Namespace) -> bool:
    """Return True when any failed-event filter was given."""
    return any(getattr(args, name, None) is not None
               for name in ("event_type", "partner", "since", "retryable"))


def query_of(args: argparse.Namespace) -> EventQuery:
    """Return the failed-event query of the filter options."""
    return failed_query(event_type=args.event_type, partner_id=args.partner, since=args.since,
                        retryable=args.retryable)


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` (as ``FLASK_APP`` does, from the current directory)."""
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute or "app")
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load the app {spec!r}: {exc}") from None


def locator(spec: str | None, store: Any) -> Callable[[Delivery], Any]:
    """Return ``locate(delivery)`` of the app ``spec`` (a Flask app or a Router), or a plain one.

    Without an app, keys follow the key rules with no router: events land on
    their own keys, but a cascade step is not recognised as a child.
    """
    from eventbus.model.router import Router
    from eventbus.processor import Intake

    if not spec:
        return routerless(store)  # from eventbus.ops.replay
    app = load_app(spec)
    if isinstance(app, Router):
        return Intake(store, app).locate
    service = getattr(app, "extensions", {}).get("eventbus")
    if service is None:
        raise UsageError(f"{spec!r} is neither an eventbus Flask app nor a Router")
    found: Callable[[Delivery], Any] = service.processor.locate
    return found

