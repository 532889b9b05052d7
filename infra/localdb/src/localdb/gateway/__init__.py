"""MongoDB wire-protocol gateway in front of PostgreSQL + the DocumentDB extension.

Clients speak MongoDB (pymongo); the gateway turns each command into a call
of the engine's `documentdb_api.*` SQL functions, passing BSON through as
raw bytes wherever it can.

Modules, from the socket inwards:
  server        accept loop, one thread per connection, shutdown
  wire          framing, OP_MSG / OP_QUERY parsing, reply encoding
  commands      dispatch by command name; failures become error replies
  transactions  commands inside a session's transaction, commit / abort
  writes        insert / update / delete / findAndModify, upsert retry
  queries       find / aggregate / getMore / killCursors / count / distinct / list* / explain
  ddl           indexes, collections, databases
  admin         hello, ping, buildInfo, endSessions, localdbExpireTTL, ...
  failures      engine errors -> MongoDB errors (with duplicate-key details)
  dupkey        E11000 messages, keyPattern / keyValue
  errors        MongoDB codes, the SQLSTATE table, MongoError
  sessions      transaction and cursor registries
  context       shared state and the per-command context
  pg            libpq sessions, prepared statements, the pool
  config        settings and defaults

CLI: `python -m localdb.gateway --listen 127.0.0.1:27018 --pg DSN`.
"""

from localdb.gateway.admin import EXPIRE_TTL_COMMAND
from localdb.gateway.config import GatewayConfig
from localdb.gateway.server import Server

__all__ = ["EXPIRE_TTL_COMMAND", "GatewayConfig", "Server"]
