"""The log store: every job's output and the platform's own logs, searchable in one place.

One contract (`base.LogStore`) with two backends, picked by OGAI_LOGS_URL the way Django picks
its database: PostgreSQL full-text search in production (`postgres.PostgresLogStore`: a table
partitioned by day, a GIN index on a tsvector) and SQLite FTS5 on the embedded default
(`sqlite.SqliteLogStore`). The store is not a Django model: it keeps its own connection, so a
store that is down or slow never holds up a request's transaction, and the platform's own
database never fills with log lines.
"""
