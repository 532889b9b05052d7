"""The local MongoDB-compatible server for development, tests and benches.

`ensure_started()` returns a URI that answers (MONGODB_URI, a throwaway
`mongod`, or DocumentDB behind the project's gateway); `stop()` stops only
what it started. CLI: `python -m infra.localdb start|stop|status|uri`.
"""

from infra.localdb.config import Backend, Config, choose_backend
from infra.localdb.errors import LocalDBError
from infra.localdb.manager import Status, ensure_started, status, stop, uri

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
