"""CLI: `python -m localdb start | stop | status | uri` (see infra/localdb/README.md).

`start` and `stop` take the claim of one user of the server (`localdb.claims`):
`--dir DIR` (default: the current directory), held while DIR exists, or `--pid PID`,
held while that process runs. `stop --force` stops the server whoever uses it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from localdb import claims, manager
from localdb.claims import Claim
from localdb.config import Config
from localdb.errors import LocalDBError

EXIT_FAILED = 1
EXIT_DOWN = 3  # `status`: the server does not answer


def cmd_start(args: argparse.Namespace) -> int:
    """Start (or find running) for this claim and print the URI; the time taken goes to stderr."""
    began = time.monotonic()
    config, claim = Config.from_env(), _claim(args)
    uri = manager.ensure_started(config, claim=claim)
    print(uri, flush=True)
    used = "" if config.mongodb_uri else f"; in use by {claim.owner}"
    manager.to_stderr(f"ready at {manager.redact(uri)} ({time.monotonic() - began:.1f} s{used})")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Release this claim; stop what localdb started if no one else uses it. Say what was done."""
    for message in manager.stop(claim=_claim(args), force=args.force):
        manager.to_stderr(message)
    return 0


def _claim(args: argparse.Namespace) -> Claim:
    if args.pid is not None:
        return claims.for_process(args.pid)
    return claims.for_directory(args.dir or os.getcwd())


def cmd_status(_: argparse.Namespace) -> int:
    """Print where the server is; exit 0 when it answers ping, 3 when not."""
    report = manager.status()
    print(f"backend: {report.backend}")
    print(f"uri: {manager.redact(report.uri)}")
    print(f"state: {'up' if report.up else 'down'}")
    for line in report.lines:
        print(f"  {line}")
    return 0 if report.up else EXIT_DOWN


def cmd_uri(_: argparse.Namespace) -> int:
    """Print only the URI."""
    print(manager.uri())
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "start": cmd_start, "stop": cmd_stop, "status": cmd_status, "uri": cmd_uri,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure becomes one "localdb: ..." line and exit 1."""
    parser = argparse.ArgumentParser(
        prog="python -m localdb",
        description="The local MongoDB-compatible server (MONGODB_URI, mongod, or DocumentDB).",
    )
    parser.add_argument("command", choices=sorted(COMMANDS))
    owner = parser.add_mutually_exclusive_group()
    owner.add_argument("--dir", metavar="DIR",
                       help="start/stop: the user is DIR, held while it exists "
                            "(default: the current directory)")
    owner.add_argument("--pid", type=int, metavar="PID",
                       help="start/stop: the user is process PID, held while it runs")
    parser.add_argument("--force", action="store_true",
                        help="stop: stop what localdb started even if others use it")
    args = parser.parse_args(argv)
    if args.force and args.command != "stop":
        parser.error("--force goes with stop only")
    try:
        return COMMANDS[args.command](args)
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
