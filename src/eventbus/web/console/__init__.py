"""The web console: seed 002's queries as pages, and replay, for authenticated operators.

* ``create_console_app(store, config, ...)``: the app ``eventbus console`` serves on 127.0.0.1;
* ``mount_console(app, config, url_prefix="/console")``: the same pages inside the service
  app (the store and the processor's ``locate`` are the service's own).

Its modules: ``views`` (the pages), ``access`` (who may sign in: IAP or a local token,
CSRF), ``charts`` (the inline SVG charts), ``serving`` (``eventbus console``'s server).

Pages: the overview (counts by status and type; throughput and failure rate
over the last hours as an inline SVG chart), the failed groups, an event (its
document, its attempt timeline, its error, its cascade as a tree of links), a
partner's history, the partners (each breaker, its parked events and rate,
held open or closed by hand with a reason, audited), and replay of one event
or a group with a confirmation step (a POST with a CSRF token; refused in
read-only mode). Assets are served
from the package; every stored value goes through Jinja's autoescaping.

The console is the web face of ``eventbus.ops``: it is the one part of the
web layer that imports the operator logic it shares with the commands
(``eventbus.ops.reports``, ``replay``, ``eventbus.partners.view``); ``eventbus.ops`` imports this
package only when ``eventbus console`` runs.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import flask

from eventbus.ops.replay import Locator, routerless
from eventbus.partners.store import PartnerStore, store_beside
from eventbus.pubsub.message import MessagePublisher
from eventbus.settings import Settings, SettingsError
from eventbus.web.console.access import CertsFetcher

AUTH_MODES = ("local", "iap", "oidc")


@dataclasses.dataclass(frozen=True)
class ConsoleConfig:
    """How the console authenticates and what it allows.

    ``local`` needs ``token``; ``iap`` and ``oidc`` need ``audience`` and a
    non-empty ``operators`` allow-list (it fails closed). ``certs`` replaces
    Google's key fetch (tests sign their own tokens).
    """

    auth: str = "local"
    token: str = ""
    audience: str = ""
    operators: tuple[str, ...] = ()
    read_only: bool = False
    replay_rate: float = 5.0
    hours: int = 24
    certs: CertsFetcher | None = None
    local_operator: str = "local operator"
    """Who replays from the ``local`` console are recorded as (``EVENTBUS_OPERATOR``)."""
    secret: bytes = dataclasses.field(default_factory=lambda: secrets.token_bytes(32))

    def __post_init__(self) -> None:
        if self.auth not in AUTH_MODES:
            raise SettingsError(f"console auth must be one of {AUTH_MODES}, not {self.auth!r}")
        if self.auth == "local" and not self.token:
            raise SettingsError("the local console needs a token")
        if self.auth != "local" and not (self.audience and any(self.operators)):
            raise SettingsError("console auth fails closed: an audience and at least one "
                                "operator e-mail are required")


@dataclasses.dataclass
class Console:
    """What the console's views use: the store, the publisher, the clock, the config."""

    store: Any
    settings: Settings
    config: ConsoleConfig
    publisher: Callable[[], MessagePublisher]
    locate: Locator
    now: Callable[[], datetime]
    verifier: Any = None
    partners: Any = None
    """The service's own ``eventbus.partners.Partners`` when mounted in it (its process's
    calls in flight are shown); None in a console of its own."""

    def partner_store(self) -> PartnerStore:
        """The partners' store: the service's own when mounted, else the one beside ``store``."""
        if self.partners is not None:
            return cast(PartnerStore, self.partners.store)
        return store_beside(self.store, self.settings)


def create_console_app(store: Any, config: ConsoleConfig, *, settings: Settings | None = None,
                       publisher: Callable[[], MessagePublisher] | None = None,
                       locate: Locator | None = None,
                       now: Callable[[], datetime] | None = None) -> flask.Flask:
    """Return a Flask app that serves only the console, at ``/``."""
    app = flask.Flask("eventbus.console", static_folder=None)  # the blueprint serves its own
    _register(app, _console(store, config, settings, publisher, locate, now), "")
    return app


def mount_console(app: flask.Flask, config: ConsoleConfig, *, url_prefix: str = "/console",
                  publisher: Callable[[], MessagePublisher] | None = None,
                  now: Callable[[], datetime] | None = None) -> flask.Flask:
    """Add the console to a service app from ``create_app`` at ``url_prefix``; return the app."""
    service = app.extensions["eventbus"]
    # The service's own clock (the store's, unless its app was given another).
    console = _console(service.store, config, service.settings, publisher,
                       service.processor.locate, now or service.processor.now)
    console.partners = service.processor.partners
    _register(app, console, url_prefix)
    return app


def serve(app: flask.Flask, host: str, port: int) -> None:
    """Serve ``app`` with Werkzeug's threaded server until interrupted (``eventbus console``).

    Its access lines go through ``RedactingHandler``: the token never reaches a log.
    """
    from werkzeug.serving import run_simple

    from eventbus.web.console.serving import RedactingHandler

    run_simple(host, port, app, threaded=True, request_handler=RedactingHandler)


def _console(store: Any, config: ConsoleConfig, settings: Settings | None,
             publisher: Callable[[], MessagePublisher] | None, locate: Locator | None,
             now: Callable[[], datetime] | None) -> Console:
    from eventbus.web.app import default_publisher

    settings = settings or Settings.from_env()
    built: list[MessagePublisher] = []

    def lazy() -> MessagePublisher:
        if not built:
            built.append(default_publisher(settings))
        return built[0]

    # The store's clock by default: a breaker closed or an event replayed from a host
    # whose clock is off must not move its times (REFERENCE.md, "Time").
    return Console(store, settings, config, publisher or lazy, locate or routerless(store),
                   now or store.now, _verifier(config))


def _verifier(config: ConsoleConfig) -> Any:
    from eventbus.web.console.access import IapVerifier, OidcVerifier

    if config.auth == "iap":
        return IapVerifier(config.audience, config.operators, config.certs)
    if config.auth == "oidc":
        return OidcVerifier(config.audience, config.operators, config.certs)
    return None


def _register(app: flask.Flask, console: Console, url_prefix: str) -> None:
    from eventbus.web.console.views import blueprint

    app.extensions["eventbus.console"] = console
    app.register_blueprint(blueprint, url_prefix=url_prefix or None)


__all__ = ["Console", "ConsoleConfig", "create_console_app", "mount_console", "serve"]
