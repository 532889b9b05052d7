"""Planner statistics of the largest collections: are they there, and are they current?

DocumentDB keeps each collection in a PostgreSQL table
(``documentdb_data.documents_<collection_id>``); the planner picks indexes from
that table's statistics, which autovacuum's ANALYZE refreshes (see
``postgres.AUTOVACUUM_NAPTIME``). A collection without them is slow in a way
that grows with its size, so ``localdb status`` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from localdb.probes import pg_query

STATS_SQL = """
SELECT c.database_name, c.collection_name, s.n_live_tup,
       greatest(s.last_analyze, s.last_autoanalyze), s.n_mod_since_analyze
FROM documentdb_api_catalog.collections c
JOIN pg_stat_user_tables s
  ON s.schemaname = 'documentdb_data' AND s.relname = 'documents_' || c.collection_id
WHERE c.collection_name NOT LIKE 'system.%'
ORDER BY s.n_live_tup DESC, c.database_name, c.collection_name
LIMIT {limit}
"""


@dataclass(frozen=True)
class CollectionStats:
    """One collection's size and when its planner statistics were last gathered."""

    namespace: str
    documents: int
    analyzed_at: datetime | None
    changed_since: int

    @property
    def current(self) -> bool:
        """Analyzed, and changed since by less than autovacuum's own trigger, twice over.

        Autovacuum analyzes past 50 + 10 % changed rows; twice that means it is late.
        """
        return self.analyzed_at is not None and \
            self.changed_since <= 2 * (50 + self.documents // 10)

    def describe(self) -> str:
        """e.g. "app.events: 52,000 documents, analyzed 12:03:04 (80 changes since): current"."""
        when = self.analyzed_at.strftime("%H:%M:%S") if self.analyzed_at else "never"
        verdict = "current" if self.current else "MISSING" if self.analyzed_at is None else "stale"
        return (f"{self.namespace}: {self.documents:,} documents, analyzed {when} "
                f"({self.changed_since:,} changes since): {verdict}")


def largest(dsn: str, limit: int = 3) -> list[CollectionStats]:
    """The ``limit`` largest collections and their statistics (raises psycopg.Error)."""
    rows = pg_query(dsn, STATS_SQL.format(limit=int(limit)))
    return [CollectionStats(f"{db}.{name}", int(live or 0), analyzed, int(changed or 0))
            for db, name, live, analyzed, changed in rows]
