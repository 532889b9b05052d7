"""CLI: `python -m localdb start | stop | status | uri` (see infra/localdb/README.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from localdb import manager
from localdb.errors import LocalDBError

EXIT_FAILED = 1
EXIT_DOWN = 3  # `status`: the server does not answer


def cmd_start() -> int:
    """Start (or find running) and print the URI; the time taken goes to stderr."""
    began = time.monotonic()
    uri = manager.ensure_started()
    print(uri, flush=True)
    manager.to_stderr(f"ready at {manager.redact(uri)} ({time.monotonic() - began:.1f} s)")
    return 0


def cmd_stop() -> int:
    """Stop what localdb started; say what was done."""
    for message in manager.stop():
        manager.to_stderr(message)
    return 0


def cmd_status() -> int:
    """Print where the server is; exit 0 when it answers ping, 3 when not."""
    report = manager.status()
    print(f"backend: {report.backend}")
    print(f"uri: {manager.redact(report.uri)}")
    print(f"state: {'up' if report.up else 'down'}")
    for line in report.lines:
        print(f"  {line}")
    return 0 if report.up else EXIT_DOWN


def cmd_uri() -> int:
    """Print only the URI."""
    print(manager.uri())
    return 0


COMMANDS: dict[str, Callable[[], int]] = {
    "start": cmd_start, "stop": cmd_stop, "status": cmd_status, "uri": cmd_uri,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure becomes one "localdb: ..." line and exit 1."""
    parser = argparse.ArgumentParser(
        prog="python -m localdb",
        description="The local MongoDB-compatible server (MONGODB_URI, mongod, or DocumentDB).",
    )
    parser.add_argument("command", choices=sorted(COMMANDS))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command]()
    except LocalDBError as exc:
        print(f"localdb: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("localdb: interrupted; run `python -m localdb status` to see what runs",
              file=sys.stderr)
    except Exception as exc:  # a bug: still one line, with the traceback on request
        if os.environ.get("LOCALDB_DEBUG"):
            raise
        print(f"localdb: unexpected {type(exc).__name__}: {exc} (LOCALDB_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
