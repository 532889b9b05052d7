"""``eventbus console [--port N] [--read-only]``: the web console on 127.0.0.1.

The console binds the loopback interface only and needs a token: the one in
``EVENTBUS_CONSOLE_TOKEN`` (``make run`` writes one to ``.env``), or a random
one made at start. The URL printed at start carries it once; the browser then
keeps it as a cookie.
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from eventbus.ops.commands.common import Tools, locator, positive

HOST = "127.0.0.1"


def add(commands: Any) -> None:
    """Register ``console``."""
    console = commands.add_parser("console", help="the web console on 127.0.0.1")
    console.add_argument("--port", type=positive, help="default $EVENTBUS_CONSOLE_PORT or 8081")
    console.add_argument("--read-only", action="store_true", help="hide and refuse replay")
    console.add_argument("--app", help="MODULE:ATTR of the service app (default $EVENTBUS_APP)")
    console.set_defaults(run=cmd_console)


def cmd_console(args: argparse.Namespace, tools: Tools) -> int:
    """Serve the console until interrupted."""
    from eventbus.web.console import serve

    app, url = build(args, tools)
    print(f"eventbus console: {url}", file=tools.out, flush=True)
    serve(app, HOST, _port(args, tools))
    return 0


def build(args: argparse.Namespace, tools: Tools) -> tuple[Any, str]:
    """Return the console app and the URL (with its token) that opens it."""
    from eventbus.web.console import ConsoleConfig, create_console_app

    token = tools.ops.console_token or secrets.token_urlsafe(24)
    config = ConsoleConfig(token=token, read_only=args.read_only or tools.ops.console_read_only)
    store = tools.store()
    app = create_console_app(store, config, settings=tools.settings,
                             publisher=tools.publisher,
                             locate=locator(args.app or tools.ops.app, store), now=tools.now)
    return app, f"http://{HOST}:{_port(args, tools)}/?token={token}"


def _port(args: argparse.Namespace, tools: Tools) -> int:
    port: int = args.port or tools.ops.console_port
    return port
