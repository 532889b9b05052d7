"""What every operator command shares: its tools, the filter options, and output."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

from eventbus.model.delivery import Delivery
from eventbus.model.router import Router
from eventbus.ops.config import OpsSettings
from eventbus.ops.render import WIDTH, safe, to_json
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
    clock: Callable[[], dt.datetime] | None = None
    """The clock the commands decide on; None (the default) is the store's own (``now``)."""
    _store: Any = None

    def now(self) -> dt.datetime:
        """The current time on the store's clock, unless a ``clock`` was given.

        Every breaker and redrive time a command writes is compared with the
        store's clock (REFERENCE.md, "Time"): a host whose clock is off by
        minutes must not move them.
        """
        return self.clock() if self.clock is not None else self.store().now()

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


def since(text: str) -> dt.datetime | dt.timedelta:
    """Parse ``--since``: a duration back from now (``90m``, ``2h``, ``7d``) or an ISO time.

    A duration stays one until ``since_at`` counts it back from the store's clock
    (REFERENCE.md, "Time"): ``--since 2h`` from a host whose clock is 30 minutes off
    means the same two hours as from any other.
    """
    match = _SINCE.fullmatch(text.strip())
    if match:
        return dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration like 2h or 7d, nor an ISO time: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def since_at(value: dt.datetime | dt.timedelta | None, tools: Tools) -> dt.datetime | None:
    """The moment of a parsed ``--since``: a duration counted back from ``tools.now()``."""
    if isinstance(value, dt.timedelta):
        return tools.now() - value
    return value


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


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` and ``--wide``: the options of every command that prints a table."""
    add_json(parser)
    parser.add_argument("--wide", action="store_true",
                        help=f"cut no value (tables fit {WIDTH} columns otherwise)")


def width_of(args: argparse.Namespace) -> int | None:
    """The columns a command's tables may take: ``WIDTH``, or None (no limit) with ``--wide``."""
    return None if getattr(args, "wide", False) else WIDTH


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


def query_of(args: argparse.Namespace, tools: Tools) -> EventQuery:
    """Return the failed-event query of the filter options (``--since`` on the store's clock)."""
    return failed_query(event_type=args.event_type, partner_id=args.partner,
                        since=since_at(args.since, tools), retryable=args.retryable)


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` as it is (as ``FLASK_APP`` does, from the current directory).

    The commands take their router through ``load_router``; this is its import step.
    """
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute or "app")
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load the app {safe(spec)!r}: {exc}") from None


APP_FORMS = "a Router, a function returning one, or an app made by eventbus.create_app"
APP_HELP = f"MODULE:ATTR of {APP_FORMS}"
"""The help of every command's ``--app`` (one loader, ``load_router``, one wording)."""


def load_router(spec: str) -> Router:
    """The router ``--app MODULE:ATTR`` names, the one loader of every command that takes it.

    ``ATTR`` is a ``Router``, a function returning one (``handlers:create_router``,
    called with no arguments), or a Flask app made by ``create_app``
    (``main:app``); a function returning such an app is taken too, as Flask
    takes a factory. Anything else is a ``UsageError`` (exit 2) naming the three.
    """
    found = load_app(spec)
    if _is_function(found):
        try:
            inspect.signature(found).bind()
        except TypeError as exc:  # a function that needs arguments is not a factory
            raise UsageError(f"{safe(spec)!r} needs arguments ({exc}); --app names "
                             f"{APP_FORMS}") from None
        except ValueError:
            pass  # no signature to read (a builtin): calling it tells
        found = found()
    router = _router_in(found)
    if router is None:
        raise UsageError(f"{safe(spec)!r} is {_kind(found)}, not {APP_FORMS}")
    return router


def _is_function(found: Any) -> bool:
    # A class is callable too (``eventbus:Router`` would build an empty router), and so is
    # every Flask app (WSGI): neither is a factory.
    return (callable(found) and not isinstance(found, type)
            and not isinstance(found, Router) and not hasattr(found, "extensions"))


def _router_in(found: Any) -> Router | None:
    if isinstance(found, Router):
        return found
    extensions = getattr(found, "extensions", None)  # a Flask app's; create_app's has ours
    service = extensions.get("eventbus") if isinstance(extensions, dict) else None
    router = getattr(getattr(service, "processor", None), "router", None)
    return router if isinstance(router, Router) else None


def _kind(found: Any) -> str:
    if isinstance(getattr(found, "extensions", None), dict):
        return "a Flask app without eventbus (not made by create_app)"
    if isinstance(found, type):
        return f"the class {found.__name__} itself"
    return f"a value of type {type(found).__name__}"


def locator(spec: str | None, store: Any) -> Callable[[Delivery], Any]:
    """Return ``locate(delivery)`` of the app ``spec`` (``load_router``'s forms), or a plain one.

    Without an app, keys follow the key rules with no router: events land on
    their own keys, but a cascade step is not recognised as a child.
    """
    from eventbus.processor import Intake

    if not spec:
        return routerless(store)  # from eventbus.ops.replay
    # An app's own processor locates with this same Intake, on its store.
    return Intake(store, load_router(spec)).locate
