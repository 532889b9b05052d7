"""CLI: `python -m localdb.gateway --listen 127.0.0.1:27018 --pg DSN`.

Logs to stderr; SIGTERM and SIGINT stop it cleanly (clients disconnected,
open transactions rolled back, exit status 0).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType

from localdb.gateway.config import DEFAULT_DSN, DEFAULT_HOST, DEFAULT_PORT, GatewayConfig
from localdb.gateway.config import parse_listen as _parse_listen
from localdb.gateway.pg import PgConnection, PgError
from localdb.gateway.server import Server

log = logging.getLogger("localdb.gateway")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m localdb.gateway",
        description="MongoDB wire-protocol gateway in front of PostgreSQL + DocumentDB.")
    parser.add_argument("--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                        help="HOST:PORT to accept MongoDB clients on (port 0: any free port)")
    parser.add_argument("--pg", default=DEFAULT_DSN, help="libpq DSN of PostgreSQL+DocumentDB")
    parser.add_argument("--pool-size", type=int, default=GatewayConfig.pool_size,
                        help="most PostgreSQL sessions to open (default %(default)s)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> GatewayConfig:
    """The gateway configuration the options describe."""
    try:
        host, port = _parse_listen(args.listen)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    if args.pool_size < 1:
        raise SystemExit("error: --pool-size must be at least 1")
    return GatewayConfig(host=host, port=port, dsn=args.pg, pool_size=args.pool_size)


def check_postgres(dsn: str) -> None:
    """Say at startup whether PostgreSQL answers; the gateway starts either way."""
    try:
        PgConnection(dsn).close()
    except PgError as exc:
        log.warning("PostgreSQL is not reachable yet (%s); commands will fail until it is",
                    exc.message)


def main(argv: list[str] | None = None) -> int:
    """Run the gateway until SIGTERM/SIGINT; the process exit status."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from(args)
    server = Server(config)
    try:
        host, port = server.bind()
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.listen, exc)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        server.shutdown()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    check_postgres(config.dsn)
    log.info("listening on %s:%d, PostgreSQL %r, pool of %d", host, port, config.dsn,
             config.pool_size)
    server.serve_forever()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
