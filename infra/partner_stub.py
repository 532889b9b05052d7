"""A local stand-in for partners' webhook endpoints, for ``make run``.

    python -m infra.partner_stub --port 9000

Answers every POST with 200 and prints one JSON line per notification
received (path, ``Idempotency-Key``, body), so a developer sees the OUT
deliveries the cascades make.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class PartnerStub(BaseHTTPRequestHandler):
    """Accepts every notification and logs it."""

    def do_POST(self) -> None:
        """Record the notification and answer 200."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 1_000_000)).decode("utf-8", "replace")
        line = {"path": self.path, "idempotencyKey": self.headers.get("Idempotency-Key"),
                "body": _json_or_text(body)}
        print(json.dumps(line), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"received": true}')

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default access log; ``do_POST`` prints its own line."""


def _json_or_text(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), PartnerStub)
    print(f"partner stub listening on http://{args.host}:{args.port}/", file=sys.stderr,
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
