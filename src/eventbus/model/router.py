"""The router: filled by decorators, dispatching on ``event_type``; no global instance.

Registration is deferred, as with Flask blueprints: each handler module
fills a ``Router`` of its own, and the application includes them into the
router it gives to ``create_app``::

    routes = Router()                      # handlers/orders.py

    @routes.handler("OR_MGMT", versions=("v2",))
    def on_order(context): ...

    router = Router().include(orders.routes, promotions.routes)   # the app

A handler that returns acks its message; a handler that raises nacks it
(see ``eventbus.model.errors.Classifier``). Each ``event_type`` has exactly one
handler, which declares the versions it reads; upcasters turn older
versions into one of those before the handler runs.

A router also holds its **forwards** (``Router.forward``): which events it
makes public on dedicated topics, under which contract (see
``eventbus.model.forward``). ``check`` refuses a forward of an internal or
unhandled type; the processor calls it when the app is built.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from eventbus.model.context import Context
from eventbus.model.errors import DuplicateHandler, UnknownEventType, UnsupportedVersion
from eventbus.model.event import EntityMetadata, Event
from eventbus.model.forward import Forward, Forwards, Path
from eventbus.model.rebuild_policy import REPLAY_POLICIES, ReplayPolicy

Handler = Callable[[Context], None] | Callable[[Context], Awaitable[None]]
"""A handler: a function of the context, or a coroutine function (``async def``)."""
Upcaster = Callable[[Event], Event]
_MAX_UPCASTS = 16


@dataclasses.dataclass(frozen=True)
class Route:
    """One registered handler with the versions it reads and its upcasters."""

    event_type: str
    handler: Handler
    versions: tuple[str, ...]
    upcasters: Mapping[str, Upcaster]
    internal: bool = False
    """A step of a cascade: runs only for children the relay published from a
    SUCCESS parent's outbox, never for a message from outside."""
    ordered_by: str | None = None
    """A dotted path to the event's position (``eventbus.model.order``): the handler
    never runs for an event older than one applied for its entity, nor beside another
    event of that entity."""
    replay: ReplayPolicy = "run"
    """What a rebuild does with this route (``eventbus.model.rebuild_policy``): ``run`` it again
    in replay mode (the default: a rebuild exists to re-run handlers, and the guard keeps
    their calls from repeating), or ``skip`` it (a pure notifier: never re-run)."""
    max_attempts: int | None = None
    """This route's attempt cap; None: ``Settings.max_attempts``."""
    max_age: float | None = None
    """Seconds after its publish time (on the store's clock) past which an event of this
    route is stored FAILED for good (``expired``) and acked, never run; None: no limit.
    A rebuild ignores it: it runs what the operator chose."""

    @functools.cached_property
    def is_async(self) -> bool:
        """True when the handler is a coroutine function: the processor awaits it on its loop."""
        handler = self.handler
        # An object whose __call__ is async counts too (its type's method, as Python calls it).
        return inspect.iscoroutinefunction(handler) or \
            inspect.iscoroutinefunction(type(handler).__call__)

    def upcast(self, event: Event) -> Event:
        """Return ``event`` at a version the handler reads, or raise ``UnsupportedVersion``.

        What an upcaster raises propagates as it is: the caller classifies it
        as the handler's own failure. One that returns no ``Event`` raises
        ``TypeError`` here, before anything reads the result (the position
        of an ordered route, the forwards after the handler).
        """
        for _ in range(_MAX_UPCASTS):
            if event.event_version in self.versions:
                return event
            upcaster = self.upcasters.get(event.event_version)
            if upcaster is None:
                break
            event = _upcast_result(upcaster(event), self.event_type, event.event_version)
        raise UnsupportedVersion(
            f"{event.event_type} {event.event_version} is not supported "
            f"(handler reads {', '.join(self.versions)})")


def _policy(event_type: str, max_attempts: object,
            max_age: object) -> tuple[int | None, float | None]:
    """A route's ``max_attempts`` and ``max_age`` checked; a clear error names the route."""
    if max_attempts is not None and (isinstance(max_attempts, bool)
                                     or not isinstance(max_attempts, int) or max_attempts < 1):
        raise ValueError(f"route {event_type!r}: max_attempts must be a whole number of 1 or "
                         f"more, not {max_attempts!r}")
    if isinstance(max_age, timedelta):
        max_age = max_age.total_seconds()
    if max_age is not None and (isinstance(max_age, bool) or not isinstance(max_age, int | float)
                                or not math.isfinite(max_age) or max_age <= 0):
        raise ValueError(f"route {event_type!r}: max_age must be a positive number of seconds "
                         f"(or a timedelta), not {max_age!r}")
    return max_attempts, None if max_age is None else float(max_age)


def _upcast_result(result: object, event_type: str, version: str) -> Event:
    # Everything after an upcaster reads the event it returned (its document,
    # its entity): a wrong return is a bug of the upcaster, raised here.
    where = f"the {event_type} upcaster of {version}"
    if not isinstance(result, Event):
        raise TypeError(f"{where} returned {type(result).__name__}, not an Event")
    if not isinstance(result.entity_metadata, EntityMetadata):
        raise TypeError(f"{where} returned an Event whose entity_metadata is "
                        f"{type(result.entity_metadata).__name__}, not EntityMetadata")
    return result


class Router:
    """Maps ``event_type`` to its handler. Registering a type twice is an error."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self.forwards = Forwards()

    def handler(self, event_type: str, *, versions: tuple[str, ...] = ("v1",),
                upcasters: Mapping[str, Upcaster] | None = None,
                internal: bool = False,
                ordered_by: str | None = None,
                replay: ReplayPolicy = "run", max_attempts: int | None = None,
                max_age: float | timedelta | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated function for ``event_type``.

        ``internal=True`` declares a step of a cascade (a partner call, say):
        it runs only for a child the relay published from its parent's outbox.
        ``ordered_by`` (a dotted path such as ``entity_data.updatedAt``) makes
        the newest event of an entity win: see ``eventbus.model.order``.
        ``replay`` says what ``eventbus rebuild`` does with it: ``run`` (default) or ``skip``.
        ``max_attempts`` caps this route's attempts (default ``Settings.max_attempts``);
        ``max_age`` (seconds or a ``timedelta``) is how long after its publish time an event
        is still worth running: older, it is stored FAILED for good (``expired``), acked.
        An impossible value raises ``ValueError`` naming the route, here, at start-up.
        """
        max_attempts, max_age = _policy(event_type, max_attempts, max_age)
        if replay not in REPLAY_POLICIES:
            raise ValueError(f"replay must be one of {REPLAY_POLICIES}, not {replay!r}")
        if ordered_by is not None and not all(ordered_by.split(".")):
            raise ValueError(f"ordered_by must be a dotted path, not {ordered_by!r}")

        def register(function: Handler) -> Handler:
            self.add(Route(event_type, function, tuple(versions), dict(upcasters or {}),
                           internal, ordered_by, replay, max_attempts, max_age))
            return function
        return register

    def add(self, route: Route) -> None:
        """Register ``route``; raise ``DuplicateHandler`` if its type is taken."""
        existing = self._routes.get(route.event_type)
        if existing is not None and existing.handler is not route.handler:
            raise DuplicateHandler(f"{route.event_type!r} already handled by "
                                   f"{existing.handler.__module__}.{existing.handler.__name__}")
        self._routes[route.event_type] = route

    def include(self, *others: Router) -> Router:
        """Add every route of ``others``; a type handled twice raises ``DuplicateHandler``."""
        for other in others:
            for route in other._routes.values():
                self.add(route)
            self.forwards.include(other.forwards)
        return self

    def forward(self, event_type: str, *, topic: str, contract: Any,
                fields: Mapping[str, str | Path],
                when: Mapping[str, Iterable[Any]] | None = None) -> Forward:
        """Forward each SUCCESS of ``event_type`` to the public ``topic`` as ``contract``.

        ``contract`` is a class marked ``@contract``; ``fields`` maps its fields
        to dotted paths of the event; ``when`` keeps events whose values at
        those paths are among the given ones. ``ContractError`` for a
        declaration that cannot work (see ``eventbus.model.forward``).
        """
        return self.forwards.add(event_type, topic=topic, contract=contract, fields=fields,
                                 when=when)

    def check(self) -> Router:
        """Refuse forwards of internal or unhandled types (``ContractError``); return self."""
        self.forwards.check({t: route.internal for t, route in self._routes.items()})
        return self

    def route_for(self, event: Event) -> Route:
        """Return the route for ``event``'s type, or raise ``UnknownEventType``."""
        route = self._routes.get(event.event_type)
        if route is None:
            raise UnknownEventType(f"no handler for event_type {event.event_type!r}")
        return route

    def route_for_type(self, event_type: str) -> Route:
        """Return the route of ``event_type``; ``KeyError`` when none is registered."""
        return self._routes[event_type]

    def resolve(self, event: Event) -> tuple[Route, Event]:
        """Return the route for ``event`` and the event upcast for it."""
        route = self.route_for(event)
        return route, route.upcast(event)

    def event_types(self) -> list[str]:
        """Return the registered event types, sorted."""
        return sorted(self._routes)
