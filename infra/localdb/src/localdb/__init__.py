"""localdb: the local MongoDB-compatible server for development, tests and benches.

Development tooling of partner-eventbus, distributed on its own as
`eventbus-localdb` (infra/localdb/ in the repository); it is never installed
with the library. The development and CI machines have no Docker engine and no
MongoDB package, so besides using `MONGODB_URI` or a `mongod` on PATH it runs
DocumentDB (PostgreSQL + the `postgresql-18-documentdb` extension) in a Debian
sid chroot behind the wire-protocol gateway in `localdb.gateway`.

`ensure_started()` returns a URI that answers (MONGODB_URI, a throwaway
`mongod`, or DocumentDB behind the gateway) and records its caller as a user
(`localdb.claims`); `stop()` releases that claim and stops only what `start`
started, once no other clone or test run uses it. CLI: `python -m localdb
start|stop|status|uri` (or `localdb ...`).

Imports: the standard library, pymongo (with its bson) and psycopg only.
Never `eventbus` or anything else of the application: the app's tests and
scripts use this package, not the other way round.
"""

from localdb.config import Backend, Config, choose_backend
from localdb.errors import LocalDBError
from localdb.manager import Status, ensure_started, status, stop, uri

__all__ = [
    "Backend",
    "Config",
    "LocalDBError",
    "Status",
    "choose_backend",
    "ensure_started",
    "status",
    "stop",
    "uri",
]
