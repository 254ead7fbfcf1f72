"""The PostgreSQL schema and its forward migrations (the twin of ``schema.py``).

Everything lives in the ``dagctx`` schema of the database the URL names, so dagctx can
share a database with other applications. The tables mirror SQLite's; the search index
is a ``tsvector`` column on ``nodes`` (GIN-indexed) with the searchable text beside it
for snippets. Free text that a client chooses (titles, names, outputs, model names) is
stored as UTF-8 ``BYTEA``: PostgreSQL's ``TEXT`` cannot hold a NUL character, which JSON
strings and SQLite may, and a value must come back exactly as it was given. Migrations run under a transaction-scoped advisory lock, so many daemons
starting at once migrate exactly once.
"""

from __future__ import annotations

from typing import Any

from .schema import refuse_newer

SCHEMA_VERSION = 4

#: advisory lock key that serialises migrations ("dagctx" as an int)
MIGRATION_LOCK = 0x646167637478

_V1 = """
CREATE TABLE dagctx.sessions(
  id TEXT PRIMARY KEY,
  title BYTEA NOT NULL,
  root_id TEXT NOT NULL,
  head TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL,
  next_seq BIGINT NOT NULL,
  rev BIGINT NOT NULL,
  node_count BIGINT NOT NULL,
  source_key BYTEA UNIQUE,
  metadata BYTEA NOT NULL
);
CREATE TABLE dagctx.nodes(
  session_id TEXT NOT NULL,
  id TEXT NOT NULL,
  seq BIGINT NOT NULL,
  rev BIGINT NOT NULL,
  role TEXT NOT NULL,
  name BYTEA NOT NULL,
  status TEXT NOT NULL,
  caller TEXT,
  predecessor TEXT,
  created_at DOUBLE PRECISION NOT NULL,
  body BYTEA NOT NULL,
  tokens BYTEA,
  search_text BYTEA,
  search_vec TSVECTOR,
  -- false: too big for the vector to keep every position; matches are checked in Python
  search_full BOOLEAN,
  PRIMARY KEY(session_id, id),
  UNIQUE(session_id, seq)
);
CREATE INDEX nodes_rev ON dagctx.nodes(session_id, rev);
CREATE INDEX nodes_search ON dagctx.nodes USING gin(search_vec);
CREATE TABLE dagctx.usage(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  model BYTEA,
  input BIGINT NOT NULL,
  output BIGINT NOT NULL,
  cache_read BIGINT NOT NULL,
  cache_write BIGINT NOT NULL,
  estimated BIGINT,
  reported_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY(session_id, node_id)
);
CREATE TABLE dagctx.blobs(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  field TEXT NOT NULL,
  chars BIGINT NOT NULL,
  lines BIGINT NOT NULL,
  data BYTEA NOT NULL,
  PRIMARY KEY(session_id, node_id, field)
);
CREATE TABLE dagctx.reduction_summaries(
  key TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  text BYTEA NOT NULL,
  input_tokens BIGINT NOT NULL,
  output_tokens BIGINT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL
)
"""

#: Version 2 (SPEC §8): a code node's ranked references beside its token counts.
_V2 = """
ALTER TABLE dagctx.nodes ADD COLUMN refs BYTEA
"""

#: Version 3 (SPEC §5.1): memory files, their chunks with a weighted ``tsvector`` (as ``nodes``), and
#: what each workspace's last index run skipped.
_V3 = """
CREATE TABLE IF NOT EXISTS dagctx.memory_files(
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  hash TEXT NOT NULL,
  mtime DOUBLE PRECISION NOT NULL,
  size BIGINT NOT NULL,
  lines BIGINT NOT NULL,
  chunks BIGINT NOT NULL,
  PRIMARY KEY(workspace, path)
);
CREATE TABLE IF NOT EXISTS dagctx.memory_chunks(
  workspace TEXT NOT NULL,
  id TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  start_line BIGINT NOT NULL,
  end_line BIGINT NOT NULL,
  hash TEXT NOT NULL,
  mtime DOUBLE PRECISION NOT NULL,
  text TEXT NOT NULL,
  search_vec TSVECTOR,
  search_full BOOLEAN,
  PRIMARY KEY(workspace, id)
);
CREATE INDEX IF NOT EXISTS memory_chunks_path ON dagctx.memory_chunks(workspace, path);
CREATE INDEX IF NOT EXISTS memory_chunks_search ON dagctx.memory_chunks USING gin(search_vec);
CREATE TABLE IF NOT EXISTS dagctx.memory_runs(
  workspace TEXT PRIMARY KEY,
  indexed_at DOUBLE PRECISION NOT NULL,
  skipped BYTEA NOT NULL
)
"""

#: Version 4 (SPEC §5.1): a vector per memory chunk and embedding model, float32 bytes (no pgvector:
#: the search is an exact matrix product in the daemon).
_V4 = """
CREATE TABLE IF NOT EXISTS dagctx.memory_vectors(
  workspace TEXT NOT NULL,
  chunk_id TEXT NOT NULL,
  model TEXT NOT NULL,
  dim INTEGER NOT NULL,
  vec BYTEA NOT NULL,
  PRIMARY KEY(workspace, chunk_id, model)
)
"""

MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}

#: Indexes every open makes sure of, whatever the version (they change no row, so an older
#: dagctx reads the schema as before): session and node ids by prefix in byte order
#: (SPEC §4.3), which the primary keys, in the database's collation, may not give; sessions
#: by the time of their last write (memory search's session index catches up on the ones
#: written since its mark, SPEC §5.1).
INDEXES = (
    ("dagctx.sessions_id_c", 'CREATE INDEX IF NOT EXISTS sessions_id_c ON dagctx.sessions (id COLLATE "C")'),
    ("dagctx.nodes_id_c", 'CREATE INDEX IF NOT EXISTS nodes_id_c ON dagctx.nodes (id COLLATE "C")'),
    ("dagctx.sessions_by_update",
     "CREATE INDEX IF NOT EXISTS sessions_by_update ON dagctx.sessions (updated_at)"),
    # a model's vectors counted without reading them (memory/index, memory/status)
    ("dagctx.memory_vectors_by_model",
     "CREATE INDEX IF NOT EXISTS memory_vectors_by_model ON dagctx.memory_vectors (workspace, model)"),
)


def migrate(conn: Any) -> int:
    """Bring the ``dagctx`` schema forward to ``SCHEMA_VERSION`` in one transaction.

    Returns the version found. A schema newer than this daemon is refused; a ``dagctx``
    schema without our version table is refused rather than written into.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        has_schema = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name='dagctx'"
        ).fetchone() is not None
        has_meta = conn.execute("SELECT to_regclass('dagctx.meta') IS NOT NULL").fetchone()[0]
        if has_schema and not has_meta:
            raise RuntimeError(
                "the database has a schema named dagctx that dagctx did not create (no dagctx.meta "
                "table); use another database, or drop that schema"
            )
        found = 0
        if has_meta:
            got = conn.execute("SELECT value FROM dagctx.meta WHERE key='schema_version'").fetchone()
            found = int(got[0]) if got else 0
        if found > SCHEMA_VERSION:
            refuse_newer(found, SCHEMA_VERSION)
        if not has_schema:
            conn.execute("CREATE SCHEMA dagctx")
            conn.execute("CREATE TABLE dagctx.meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version].split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO dagctx.meta(key, value) VALUES('schema_version', %s) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(version),),
            )
        for name, statement in INDEXES:
            # looked up first: CREATE INDEX locks the table against writes even when it exists
            if conn.execute("SELECT to_regclass(%s) IS NULL", (name,)).fetchone()[0]:
                conn.execute(statement)
    return found
