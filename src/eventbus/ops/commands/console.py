"""``eventbus console [--port N] [--host H] [--read-only]``: the web console.

``EVENTBUS_CONSOLE_AUTH`` decides who gets in (``eventbus.web.console.access``):

* ``local`` (default): the console binds 127.0.0.1 only and needs a token: the
  one in ``EVENTBUS_CONSOLE_TOKEN`` (``make run`` writes one to ``.env``,
  mode 0600), or a random one made at start. The URL with the token is printed
  only to a terminal (a log gets it redacted); the browser then keeps it as a
  cookie. Replays are recorded as ``EVENTBUS_OPERATOR``.
* ``iap`` / ``oidc``: every request needs IAP's signed header or a Google ID
  token for ``EVENTBUS_CONSOLE_AUDIENCE`` whose e-mail is on
  ``EVENTBUS_CONSOLE_OPERATORS``; replays are recorded under that e-mail.
  ``--host`` may then bind another interface (behind the proxy).

Any other value, or a signed mode without audience or operators, refuses to
start (exit 2). Werkzeug's access lines never carry the token.
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from eventbus.ops.commands.common import APP_HELP, Tools, locator, positive
from eventbus.settings import SettingsError

HOST = "127.0.0.1"


def add(commands: Any) -> None:
    """Register ``console``."""
    console = commands.add_parser("console", help="the web console on 127.0.0.1")
    console.add_argument("--port", type=positive, help="default $EVENTBUS_CONSOLE_PORT or 8081")
    console.add_argument("--host", default=HOST,
                         help="interface to bind (iap/oidc only; local is 127.0.0.1)")
    console.add_argument("--read-only", action="store_true", help="hide and refuse replay")
    console.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP)")
    console.set_defaults(run=cmd_console)


def cmd_console(args: argparse.Namespace, tools: Tools) -> int:
    """Serve the console until interrupted."""
    from eventbus.web.console import serve

    app, url = build(args, tools)
    shown = url if getattr(tools.out, "isatty", lambda: False)() else redact(url)
    print(f"eventbus console: {shown}", file=tools.out, flush=True)
    serve(app, args.host, _port(args, tools))
    return 0


def build(args: argparse.Namespace, tools: Tools) -> tuple[Any, str]:
    """Return the console app and the URL that opens it (with its token when local)."""
    from eventbus.web.console import create_console_app

    config = console_config(args, tools)
    store = tools.store()
    app = create_console_app(store, config, settings=tools.settings,
                             publisher=tools.publisher,
                             locate=locator(args.app or tools.ops.app, store), now=tools.now)
    base = f"http://{args.host}:{_port(args, tools)}/"
    return app, base + (f"?token={config.token}" if config.auth == "local" else "")


def console_config(args: argparse.Namespace, tools: Tools) -> Any:
    """The console's configuration from the operator settings; ``SettingsError`` if unusable."""
    from eventbus.web.console import ConsoleConfig

    ops, read_only = tools.ops, args.read_only or tools.ops.console_read_only
    if ops.console_auth != "local":
        return ConsoleConfig(auth=ops.console_auth, audience=ops.console_audience,
                             operators=ops.console_operators, read_only=read_only)
    if args.host != HOST:
        raise SettingsError("the local console binds 127.0.0.1 only; --host needs "
                            "EVENTBUS_CONSOLE_AUTH=iap or oidc")
    return ConsoleConfig(token=ops.console_token or secrets.token_urlsafe(24),
                         read_only=read_only, local_operator=ops.operator or "local operator")


def redact(url: str) -> str:
    """``url`` with its token replaced, for anything that is not a terminal."""
    head, found, _ = url.partition("?token=")
    return head + ("?token=<EVENTBUS_CONSOLE_TOKEN>" if found else "")


def _port(args: argparse.Namespace, tools: Tools) -> int:
    port: int = args.port or tools.ops.console_port
    return port
